"""The Airflow Assets of the provider's operators: a lake, and each table in it.

A lake is one Asset, known by its URI (``file://`` + absolute path, or ``s3://bucket/prefix``):
the drain and the snapshot name it among their ``outlets`` by default, and Airflow emits an event
of it after each of their successful runs. A DAG scheduled on it runs after every run.

Each table of a lake is an Asset too, one per kind (``changes``, ``state``, ``history``), with a
URI of the provider's own schemes (registered in ``get_provider_info``'s ``asset-uris``)::

    pglogrepl+file:/srv/lake/state/public.orders
    pglogrepl+s3://bucket/prefix/state/public.orders

(Airflow writes a URI with no host with one slash, as here.)

The drain emits an event of a table's Asset only after a run that changed that table there,
through an ``AssetAlias`` among its outlets (``lake_tables_alias``), with ``extra`` saying what
the run did (``table_events``). So a DAG scheduled on ``lake_table_asset(lake,
"public.orders")`` runs after the drains that changed ``public.orders``, and not after the
others. Each maps to the OpenLineage dataset the operators' lineage names the same table by
(``convert_asset_to_openlineage``).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias

if TYPE_CHECKING:
    from urllib.parse import SplitResult

    from airflow_pglogrepl.tables import TableRef

PREFIX = "pglogrepl+"
SCHEMES = (f"{PREFIX}file", f"{PREFIX}s3")
KINDS = ("changes", "state", "history")


def lake_asset(lake_root: str) -> Asset:
    """The Asset a lake is known by: its URI (``file://`` + absolute path for local paths). A
    URI with credentials in it is refused (it would be in every Asset event)."""
    return Asset(uri=_location(lake_root))


def lake_tables_alias(lake_root: str) -> AssetAlias:
    """The alias through which a run emits the events of the lake's tables it changed."""
    return AssetAlias(name=f"pglogrepl-tables:{_location(lake_root)}")


def lake_table_asset(lake_root: str, table: str | TableRef, kind: str = "state") -> Asset:
    """The Asset of one table of a lake: ``kind`` is ``changes``, ``state`` or ``history``,
    ``table`` a ``schema.table`` name (or a ``TableRef``). Schedule a DAG on it to run after
    the drains that changed that table."""
    from airflow_pglogrepl.lake.layout import table_dir
    from airflow_pglogrepl.tables import TableRef

    if kind not in KINDS:
        raise ValueError(f"a lake table's kind is one of {KINDS}, not {kind!r}")
    name = urllib.parse.quote(table_dir(TableRef.parse(table)), safe="")
    return Asset(uri=f"{PREFIX}{_location(lake_root)}/{kind}/{name}")


def create_asset(*, lake: str, table: str, kind: str = "state",
                 extra: dict[str, Any] | None = None) -> Asset:  # fmt: skip
    """The ``asset-uris`` factory: ``lake_table_asset`` with an ``extra``."""
    asset = lake_table_asset(lake, table, kind)
    return Asset(uri=asset.uri, extra=extra or {})


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """The ``asset-uris`` handler: a lake table's URI names a location, a kind and a table."""
    parts = uri.path.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] not in KINDS or not parts[-1]:
        raise ValueError(
            f"a {uri.scheme}:// URI names a lake's table: <lake>/<kind>/<schema.table>, kind "
            f"one of {', '.join(KINDS)} (lake_table_asset makes it)"
        )
    if uri.scheme == f"{PREFIX}s3" and not uri.netloc:
        raise ValueError(f"a {uri.scheme}:// URI names the lake's bucket")
    return uri


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Any:
    """The OpenLineage dataset of a lake table's Asset: the one the drain's lineage names the
    table by (``operators.lineage.lake_location``)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    from airflow_pglogrepl.operators.lineage import lake_location

    location = urllib.parse.unquote(asset.uri[len(PREFIX) :])
    namespace, name = lake_location(location)
    return Dataset(namespace=namespace, name=name)


def table_events(result: Mapping[str, Any], lake_root: str) -> list[tuple[Asset, dict[str, Any]]]:
    """The table Assets a drain run changed, each with its event's ``extra``: the table, the
    kind, the lake's position after the run, the Delta version the run left the table at, and
    how many changes of the table the run drained. A table changed when the run drained changes
    of it (its ``changes/``, its ``state/`` once merged, its ``history/`` once kept), or copied
    it from the source again (a backfill: its ``state/`` and ``history/``)."""
    from airflow_pglogrepl.lake.layout import table_dir, table_from_dir
    from airflow_pglogrepl.tables import TableRef

    def by_dir(names: Any) -> set[str]:  # the run's names, as directory names
        return {table_dir(TableRef.parse(n)) for n in names or ()}

    counts = {table_dir(TableRef.parse(n)): c for n, c in (result.get("tables") or {}).items()}
    copied = by_dir(t for t, b in (result.get("backfills") or {}).items() if (b or {}).get("built"))
    changed = set(counts) | copied
    merged = {
        "changes": set(counts),
        "state": changed & set(result.get("materialized") or {}) | copied,
        "history": changed & set(result.get("history") or {}),
    }
    versions = result.get("table_versions") or {}
    lsn = result.get("confirmed_flush_lsn_after")
    events = []
    for kind in KINDS:
        for name in sorted(merged[kind]):
            table = table_from_dir(name)
            extra = {"table": str(table), "kind": kind, "lsn": lsn, "changes": counts.get(name, 0),
                     "delta_version": versions.get(f"{kind}/{name}"),
                     "slot": result.get("slot")}  # fmt: skip
            events.append((lake_table_asset(lake_root, table, kind), extra))
    return events


def snapshot_events(result: Mapping[str, Any],
                    lake_root: str) -> list[tuple[Asset, dict[str, Any]]]:  # fmt: skip
    """The ``state/`` Asset of each table a snapshot copied, with the copy in its ``extra``:
    the table, the kind, the consistent point its rows are as of, and the rows copied."""
    if not result.get("committed", True):
        return []
    events = []
    for table, copied in sorted((result.get("tables") or {}).items()):
        extra = {"table": table, "kind": "state", "lsn": result.get("consistent_point"),
                 "rows": (copied or {}).get("rows"), "slot": result.get("slot")}  # fmt: skip
        events.append((lake_table_asset(lake_root, table, "state"), extra))
    return events


def _location(lake_root: str) -> str:
    """A lake's URI: ``file://`` + its absolute path, or its object store URI (one spelling)."""
    from airflow_pglogrepl.hooks.object_store import check_lake_uri
    from airflow_pglogrepl.lake.storage import canonical

    check_lake_uri(lake_root)
    if "://" in lake_root and not lake_root.startswith("file://"):
        return canonical(lake_root)
    path = lake_root[len("file://") :] if lake_root.startswith("file://") else lake_root
    return f"file://{os.path.abspath(path)}"
