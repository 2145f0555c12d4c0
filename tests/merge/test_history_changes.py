"""A changelog as its history reads it: what the schema says, rows by range, conformed rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from airflow_pglogrepl.changelog.columns import COMMIT_TS
from airflow_pglogrepl.changelog.history_columns import HISTORY_COLUMNS
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge.history_changes import TableChanges, conformed
from tests.merge.test_history import T, window


def test_the_schema_says_the_key_the_identity_and_the_columns(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}, {"_op": "I", "id": 2, "v": 2}])
    table = TableChanges(delta.open_table(lake.paths.changes(T)))
    assert (table.keys, table.full, table.columns) == (["id"], False, ["id", "v", "big"])
    assert table.types.names == ["id", "v", "big", *HISTORY_COLUMNS]
    assert table.read(0x100, 0x111).column("id").to_pylist() == [1]  # [have, end)
    assert table.read(None, int(end)).num_rows == 2
    assert table.read(None, int(end)).schema.field(COMMIT_TS).type.tz == "UTC"


def test_conformed_rows_take_the_storeds_order_and_null_what_they_lack() -> None:
    stored = pa.schema([("b", pa.string()), ("a", pa.int64()), ("gone", pa.int32())])
    rows = conformed(pa.table({"a": pa.array([1], pa.int32()), "b": ["x"]}), stored)
    assert rows.schema == stored
    assert rows.to_pylist() == [{"b": "x", "a": 1, "gone": None}]


def test_a_range_is_sized_before_it_is_read(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": k, "v": k} for k in range(1, 50)])
    table = TableChanges(delta.open_table(lake.paths.changes(T)))
    size = table.size_bytes(None, int(end))
    assert size >= table.read(None, int(end)).nbytes // 2 > 0
