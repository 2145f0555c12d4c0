"""Snapshots in the tests' own Spark session, into an existing lake, or as the application."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import app_env
from tests.support.sources import Source


def re_snapshot(spark: Any, src: Source, lake_root: str, tables: list[TableRef]) -> None:
    """The fix the errors name: a one-table snapshot (here in process, on the session's Spark)."""
    from airflow_pglogrepl.spark.snapshot import SnapshotCopy, SnapshotPoint, temporary_slot_name

    hook = src.hook()
    with (
        hook.writer_lock(src.slot),
        hook.create_slot_with_snapshot(temporary_slot_name(src.slot), temporary=True) as held,
    ):
        SnapshotCopy(
            spark=lambda: spark, lake=Lake(lake_root, src.slot),
            reader_params=hook.connection_params(),
            publications=[src.publication], tables=tables,
            point=SnapshotPoint(src.slot, held.consistent_point, held.snapshot_name),
        ).run()  # fmt: skip


def snapshot_app(src: Source, lake_root: str, *args: str, fault: str | None = None) -> Any:
    """The standalone application as a real process (its own JVM and exporting session), so
    ``fault`` can kill it as SIGKILL would: nothing of it runs after that point."""
    env = {**os.environ, "PGLOGREPL_SOURCE_DSN": src.dsn, **app_env()}
    env.pop("PGLOGREPL_FAULT", None)
    if fault:
        env["PGLOGREPL_FAULT"] = fault
    command = [sys.executable, "-m", "airflow_pglogrepl.spark.snapshot_app", "--slot", src.slot,
               "--publication", src.publication, "--lake", lake_root, *args]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
