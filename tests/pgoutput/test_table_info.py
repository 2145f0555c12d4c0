"""A table's description on its own: its key columns, its values converted, equality, and
pickling to Spark's executors (the converters rebuilt on the other side)."""

from __future__ import annotations

import pickle

import pytest

from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.values import OID

pytestmark = pytest.mark.unit


def _table() -> TableInfo:
    return TableInfo("public", "t", [
        ColumnInfo("id", OID.INT4, -1, True, OID.INT4, "integer"),
        ColumnInfo("v", OID.TEXT, -1, False, OID.TEXT, "text"),
        ColumnInfo("n", OID.INT8, -1, False, OID.INT8, "bigint"),
    ], relation_id=16384, replica_identity="d")  # fmt: skip


def test_a_table_knows_its_key_and_travels_to_executors_whole() -> None:
    table = _table()
    assert table.relation == ("public", "t") and table.key_names == ("id",)
    again = pickle.loads(pickle.dumps(table))
    assert again == table and again.values([b"1", b"a", b"2"]) == {"id": 1, "v": "a", "n": 2}
    assert table != TableInfo("public", "t", table.columns[:2], relation_id=16384)
