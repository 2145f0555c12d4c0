"""A table's description on its own: its key columns, its values converted, equality, and
pickling to Spark's executors (the converters rebuilt on the other side)."""

from __future__ import annotations

import pickle

import pytest

from airflow_pglogrepl.pgoutput.table_info import TableInfo
from tests.support.pgoutput_encoder import table_t

pytestmark = pytest.mark.unit


def test_a_table_knows_its_key_and_travels_to_executors_whole() -> None:
    table = table_t()
    assert table.relation == ("public", "t") and table.key_names == ("id",)
    again = pickle.loads(pickle.dumps(table))
    assert again == table and again.values([b"1", b"a", b"2"]) == {"id": 1, "v": "a", "n": 2}
    assert table != TableInfo("public", "t", table.columns[:2], relation_id=16384)
