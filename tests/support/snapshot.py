"""Snapshots in the tests' own Spark session, into an existing lake."""

from __future__ import annotations

from typing import Any

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.tables import TableRef
from tests.support.sources import Source


def re_snapshot(spark: Any, src: Source, sink: str, tables: list[TableRef]) -> None:
    """The fix the errors name: a one-table snapshot (here in process, on the session's Spark)."""
    from airflow_pglogrepl.spark.snapshot import SnapshotCopy, SnapshotPoint, temporary_slot_name

    hook = src.hook()
    with (
        hook.writer_lock(src.slot),
        hook.create_slot_with_snapshot(temporary_slot_name(src.slot), temporary=True) as held,
    ):
        SnapshotCopy(
            spark=spark, lake=Lake(sink, src.slot), reader_params=hook.connection_params(),
            publications=[src.publication], tables=tables,
            point=SnapshotPoint(src.slot, held.consistent_point, held.snapshot_name),
        ).run()  # fmt: skip
