"""A slot's record kept as a small Delta table of versions: each version one row, committed
compare-and-set on the slot's app transaction under the writer lock, the newest the one that
holds (``lake.coverage``, ``lake.backfill``). A record made from an older version than the
newest is refused (``LakeCommitConflictError``): two writers cannot both record."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.layout import app_id

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

__all__ = ["read_newest", "record_schema", "write_next"]


def record_schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    """The table's columns: the slot, the version, then ``fields`` (a ``recorded_at`` among
    them is filled by ``write_next``)."""
    import pyarrow as pa

    return pa.schema([("slot", pa.string()), ("version", pa.int64()), *fields])


def read_newest(lake: Lake, uri: str) -> tuple[int, dict[str, Any] | None] | None:
    """The newest version of ``lake``'s slot at ``uri`` and its row (None: no version yet;
    a version whose row is missing: None beside it)."""
    table = delta.open_table(uri)
    if table is None:
        return None
    version = table.transaction_version(app_id(lake.slot))
    if version is None:
        return None
    rows = delta.read_table(uri, version=table.version()).to_pylist()
    newest = [r for r in rows if r["slot"] == lake.slot and r["version"] == int(version)]
    return int(version), (newest[0] if newest else None)


def write_next(lake: Lake, uri: str, schema: pa.Schema, row: Mapping[str, Any], *,
               made_from: int, name: str) -> int:  # fmt: skip
    """Commit ``row`` (with the slot and the next version) if the newest version is still
    ``made_from`` (0: none); the version written."""
    import pyarrow as pa

    version = made_from + 1
    row = {**row, "slot": lake.slot, "version": version}
    if "recorded_at" in schema.names:
        row["recorded_at"] = dt.datetime.now(dt.UTC)
    rows = pa.Table.from_pylist([row], schema=schema)
    written = delta.write_file(uri, rows, prefix=f"{name.rsplit(' ', 1)[-1]}-{version:08d}")
    lake.check_writer()
    delta.commit_files(uri, rows.schema, [written], app=app_id(lake.slot),
                       expected=made_from or None, version=version, name=name,
                       configuration=delta.KEEP_LOGS)  # fmt: skip
    return version
