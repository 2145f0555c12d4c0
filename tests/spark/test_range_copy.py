"""A table's copy in block ranges, without a server or Spark: ranges that cover every block
once (sized from the planner's statistics, or from blocks when it never measured the table),
and batches converted as the drain converts values, naming a value the lake cannot hold. (A
range read from a live snapshot through ADBC: test_snapshot.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import UnstorableValueError
from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.values import OID
from airflow_pglogrepl.postgres.snapshot import SnapshotTable
from airflow_pglogrepl.spark.range_copy import (
    BlockRange,
    lake_batch,
    plain_schema,
    plan_ranges,
    read_plan,
)
from airflow_pglogrepl.tables import TableRef


def _table(blocks: int, reltuples: float, relpages: int, relkind: str = "r") -> SnapshotTable:
    return SnapshotTable(
        table=TableRef("public", "t"), relid=1, relkind=relkind, replica_identity="d",
        columns=(), row_filter=None, blocks=blocks, reltuples=reltuples, relpages=relpages,
        publications=("p",), span=blocks,
    )  # fmt: skip


def test_plan_ranges_cover_every_block_once() -> None:
    ranges = plan_ranges(_table(1000, 100_000, 1000), max_tasks=4, rows_per_task=30_000)
    assert ranges == [BlockRange(0, 250), BlockRange(250, 500), BlockRange(500, 750),
                      BlockRange(750, None)]  # fmt: skip
    assert plan_ranges(_table(1000, 100_000, 1000), max_tasks=8, rows_per_task=60_000) == [
        BlockRange(0, 500), BlockRange(500, None)
    ]  # fmt: skip
    # never analyzed: sized from blocks; tiny and partitioned tables: one open range
    assert len(plan_ranges(_table(100, -1, 0), max_tasks=8, rows_per_task=1000)) == 6
    assert plan_ranges(_table(3, 300, 3), max_tasks=8, rows_per_task=1) == [
        BlockRange(0, 1), BlockRange(1, 2), BlockRange(2, None)
    ]  # fmt: skip
    assert plan_ranges(_table(0, 0, 0), max_tasks=8, rows_per_task=1) == [BlockRange(0, None)]
    # a partitioned table: its leaves' blocks summed (1000 over 4 leaves) are sized, and its
    # ranges cut each leaf at the same numbers, up to its biggest leaf's (400 blocks)
    parted = dataclasses.replace(_table(1000, 100_000, 1000, "p"), span=400)
    assert plan_ranges(parted, max_tasks=4, rows_per_task=50_000) == [
        BlockRange(0, 200), BlockRange(200, None)
    ]  # fmt: skip
    assert plan_ranges(dataclasses.replace(parted, blocks=0, span=0), max_tasks=8,
                       rows_per_task=1) == [BlockRange(0, None)]  # fmt: skip


def test_the_snapshot_stores_what_the_drain_stores_and_names_what_neither_can() -> None:

    info = TableInfo(
        "public",
        "t",
        [
            ColumnInfo("id", OID.INT4, -1, True, OID.INT4),
            ColumnInfo("ts", OID.TIMESTAMP, -1, False, OID.TIMESTAMP),
            ColumnInfo("tm", OID.TIME, -1, False, OID.TIME),
        ],
    )
    plan, schema = read_plan(info), plain_schema(info)
    assert [c.cast for c in plan] == ["int8", None, None]

    def fetched(ids: list[int], stamps: list[str | None], times: list[str | None]) -> Any:
        columns = [pa.array(ids, pa.int64()), pa.array(stamps), pa.array(times, pa.string())]
        return pa.record_batch(columns, names=["id", "ts", "tm"])

    copied = lake_batch(
        fetched([1, 2, 3], ["infinity", "0001-01-01 00:00:00 BC", None],
                ["24:00:00", "00:00:01", None]),
        plan, schema, "public.t",
    )  # fmt: skip
    assert copied.column("ts").cast(pa.int64()).to_pylist() == [
        2**63 - 1,
        -62_167_219_200_000_000,
        None,
    ]
    assert copied.column("tm").to_pylist() == [86_400_000_000, 1_000_000, None]
    with pytest.raises(
        UnstorableValueError,
        match=r"table public\.t, column 'ts': the value '294250-01-01 00:00:00' cannot be stored",
    ):
        lake_batch(fetched([1], ["294250-01-01 00:00:00"], [None]), plan, schema, "public.t")
