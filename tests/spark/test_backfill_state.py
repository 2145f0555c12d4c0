"""Where a backfill's changes begin: its ``low``, or earlier when a transaction in progress at
its start committed a change of the table before ``low`` (its commit record written, its
backend not yet gone from the process array when a chunk's snapshot was taken: that chunk
read the row without the change, so the change must be applied over it)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.backfill import Plan
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.backfill_state import changes_from

PLAN = Plan(table="public.b", relid=1, why="added", low="0/5000", in_progress=(700, 701),
            files=(1,), columns=("id",), step=10, began="2026-12-02T13:00:00+00:00")  # fmt: skip


def _changes(lake: Lake, rows: list[tuple[int, int]]) -> None:
    table = pa.table({"id": pa.array(range(len(rows)), pa.int64()),
                      "_commit_lsn": pa.array([r[0] for r in rows], pa.int64()),
                      "_xid": pa.array([r[1] for r in rows], pa.int64())})  # fmt: skip
    uri = lake.paths.changes("public.b")
    delta.commit_files(uri, table.schema, [delta.write_file(uri, table, prefix="c")],
                       app=lake.app, version=1, expected=None)  # fmt: skip


def test_changes_begin_at_low_without_a_late_commit_of_a_running_transaction(
    spark: Any, tmp_path: Any
) -> None:
    lake = Lake(str(tmp_path / "lake"), "slot_a")
    assert changes_from(spark, lake, PLAN) == LSN("0/5000")  # no changelog at all
    _changes(lake, [(0x3000, 699), (0x6000, 700)])  # 699 was not running; 700 after low
    assert changes_from(spark, lake, PLAN) == LSN("0/5000")


def test_a_running_transactions_commit_before_low_moves_the_start_back(
    spark: Any, tmp_path: Any
) -> None:
    lake = Lake(str(tmp_path / "lake"), "slot_a")
    _changes(lake, [(0x2000, 699), (0x4000, 701), (0x4800, 700), (0x6000, 700)])
    assert changes_from(spark, lake, PLAN) == LSN("0/4000")
