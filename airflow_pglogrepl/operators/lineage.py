"""OpenLineage datasets of the provider's operators, for Airflow's OpenLineage provider.

Data teams build their catalog from these events: without them the lake's tables appear in no
lineage graph. The snapshot and the drain read the published PostgreSQL tables and write the
lake's Delta tables (``changes/`` and ``state/``); a subscription reads the publisher's tables
and writes the subscriber's tables of the same names (logical replication matches them by name).

Names follow OpenLineage's naming spec: a PostgreSQL table is ``db.schema.table`` in namespace
``postgres://host:port``; a lake table is its key in namespace ``s3://bucket``, or its absolute
path in namespace ``file``. No part carries a user or a password. Each dataset has its schema,
and each written table says which source column each of its columns comes from.

The operators call this from ``get_openlineage_facets_on_complete``, which Airflow calls only
when the OpenLineage provider is installed and configured; its classes are imported here, inside
the functions, so the provider stays optional.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake.layout import is_local, local_path, table_dir
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook

# (name, PostgreSQL type, type oid, type modifier) of each published column
Columns = list[tuple[str, str, int, int]]


def postgres_namespace(params: Mapping[str, Any]) -> str:
    """``postgres://host:port`` of libpq parameters (the user and password left out; a Unix
    socket's directory, or no host, is ``localhost``; of several hosts, the first)."""
    host = str(params.get("host") or "localhost").split(",")[0].strip()
    if host.startswith("/") or "@" in host or "://" in host or not host:
        host = "localhost"
    port = str(params.get("port") or 5432).split(",")[0].strip()
    return f"postgres://{host}:{port if port.isdigit() else 5432}"


def lake_location(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a lake table's URI: ``s3://bucket`` and the key prefix, or
    ``file`` and the absolute path."""
    if is_local(uri):
        return "file", os.path.abspath(local_path(uri))
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    return f"{'s3' if scheme in ('s3', 's3a', 's3n') else scheme}://{bucket}", key.rstrip("/")


Published = tuple[str, str, dict[TableRef, Columns]]


def published(hook: PgLogicalReplicationHook, publications: Sequence[str]) -> Published:
    """The publisher's namespace, database and published tables with their columns (one
    session: the task's lineage costs one connection to the publisher)."""
    with hook.session() as conn:
        tables = hook.published_columns([str(p) for p in publications], conn=conn)
        database = hook.database_name(conn=conn)
    return postgres_namespace(hook.connection_params()), database, tables


def lake_lineage(hook: PgLogicalReplicationHook, publications: Sequence[str], lake_root: str, *,
                 kinds: Sequence[str] = ("changes", "state"),
                 only: Sequence[str] | None = None) -> Any:  # fmt: skip
    """``OperatorLineage``: the published tables (``only`` these, as ``schema.table``, when
    given) in, the lake's tables of ``kinds`` out (none: a failed run's, which may have written
    part of them)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_pglogrepl.changelog.columns import META_COLUMNS
    from airflow_pglogrepl.changelog.types import arrow_type

    namespace, database, tables = published(hook, publications)
    if only is not None:
        wanted = {TableRef.parse(t) for t in only}
        tables = {ref: columns for ref, columns in tables.items() if ref in wanted}
    inputs, outputs = [], []
    root = lake_root.rstrip("/")
    for ref, columns in tables.items():
        source_name = f"{database}.{ref.schema}.{ref.name}"
        inputs.append(_dataset("input", namespace, source_name,
                               [(c, t) for c, t, _, _ in columns]))  # fmt: skip
        lake_columns = [(c, str(arrow_type(oid, typmod))) for c, _, oid, typmod in columns]
        for kind in kinds:
            out_namespace, out_name = lake_location(f"{root}/{kind}/{table_dir(ref)}")
            meta = [(m, "changelog metadata") for m in META_COLUMNS] if kind == "changes" else []
            outputs.append(_dataset("output", out_namespace, out_name, lake_columns + meta,
                                    lineage=(namespace, source_name,
                                             [c for c, _, _, _ in columns])))  # fmt: skip
    return OperatorLineage(inputs=inputs, outputs=outputs)


def subscription_lineage(publisher: PgLogicalReplicationHook,
                         subscriber: PgLogicalReplicationHook,
                         publications: Sequence[str]) -> Any:  # fmt: skip
    """``OperatorLineage``: the publisher's published tables in, the subscriber's tables of the
    same names out."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    namespace, database, tables = published(publisher, publications)
    out_namespace = postgres_namespace(subscriber.connection_params())
    out_database = subscriber.database_name()
    inputs, outputs = [], []
    for ref, columns in tables.items():
        typed = [(c, t) for c, t, _, _ in columns]
        source_name = f"{database}.{ref.schema}.{ref.name}"
        inputs.append(_dataset("input", namespace, source_name, typed))
        target = f"{out_database}.{ref.schema}.{ref.name}"
        lineage = (namespace, source_name, [c for c, _ in typed])
        outputs.append(_dataset("output", out_namespace, target, typed, lineage=lineage))
    return OperatorLineage(inputs=inputs, outputs=outputs)


def _dataset(kind: str, namespace: str, name: str, columns: Sequence[tuple[str, str]],
             lineage: tuple[str, str, list[str]] | None = None) -> Any:  # fmt: skip
    """An input or output dataset with its schema facet and, for an output, the column
    lineage from its source table (each column from the source column of its name)."""
    from airflow.providers.common.compat.openlineage.facet import (
        ColumnLineageDatasetFacet,
        Fields,
        InputDataset,
        InputField,
        OutputDataset,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
    )

    facets: dict[str, Any] = {
        "schema": SchemaDatasetFacet(
            fields=[SchemaDatasetFacetFields(name=c, type=t) for c, t in columns]
        )
    }
    if lineage is not None:
        source_namespace, source_name, source_columns = lineage
        facets["columnLineage"] = ColumnLineageDatasetFacet(fields={
            column: Fields(
                inputFields=[InputField(namespace=source_namespace, name=source_name,
                                        field=column)],
                transformationType="IDENTITY", transformationDescription="",
            )
            for column in source_columns
        })  # fmt: skip
    made = InputDataset if kind == "input" else OutputDataset
    return made(namespace=namespace, name=name, facets=facets)
