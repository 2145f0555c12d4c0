"""A copy's lake schema, without a server: the drain's types under the lake's names, the key's
positions, the source name of a column stored under another, every column's attribute number."""

from __future__ import annotations

import pyarrow as pa

from airflow_pglogrepl.pgoutput.values import OID
from airflow_pglogrepl.postgres.snapshot import SnapshotTable
from airflow_pglogrepl.spark.snapshot_target import CopyTarget, lake_schema
from airflow_pglogrepl.tables import Column, TableRef


def _table() -> SnapshotTable:
    columns = (
        Column("v", "text", attnum=1, type_oid=OID.TEXT, base_name="text"),
        Column("id", "bigint", attnum=3, type_oid=OID.INT8, base_name="int8", is_key=True),
        Column("k", "integer", attnum=4, type_oid=OID.INT4, base_name="int4", is_key=True),
    )
    return SnapshotTable(
        table=TableRef("public", "t"), relid=1, relkind="r", replica_identity="d",
        columns=columns, row_filter=None, blocks=1, reltuples=1, relpages=1,
        publications=("p",), span=1,
    )  # fmt: skip


def test_the_lake_schema_carries_names_keys_sources_and_attnums() -> None:
    names = {"v": "v", "id": "id", "k": "k_2"}
    schema = lake_schema(_table(), names)
    assert schema.names == ["v", "id", "k_2"]
    assert schema.field("id").type == pa.int64() and schema.field("k_2").type == pa.int64()
    meta = {f.name: {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}
            for f in schema}  # fmt: skip
    assert meta == {
        "v": {"pglogrepl.attnum": "1"},
        "id": {"pglogrepl.key": "0", "pglogrepl.attnum": "3"},
        "k_2": {"pglogrepl.key": "1", "pglogrepl.source_name": "k", "pglogrepl.attnum": "4"},
    }
    target = CopyTarget(uri="/x", lake_names=names, schema=schema, mapped=False,
                        configuration={}, app="a", version=1, resnapshot=False)  # fmt: skip
    assert target.renamed == {"k": "k_2"}
