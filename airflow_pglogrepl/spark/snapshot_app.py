"""Spark application: a consistent initial snapshot of published tables into a Delta lake.

Run it as ``spark-submit snapshot_app.py ARGS`` (any master) or ``python -m
airflow_pglogrepl.spark.snapshot_app ARGS`` (local Spark). As with the drain application, the
source database comes only from ``PGLOGREPL_SOURCE_DSN`` in the environment, and the last line on
stdout is one JSON object with what the run did; a failure exits non-zero with the reason on
stderr.

Who holds the exporting session decides the mode:

- standalone (no ``--snapshot-name``): this process creates the slot with an exported snapshot,
  keeps that session open while Spark copies, and drops the slot again if the copy fails before
  it is committed (``--replace-slot`` re-creates a slot left behind by a killed run);
- handed a snapshot (``--snapshot-name`` and ``--consistent-point``, as ``InitialSnapshotOperator``
  does): the caller created the slot and holds the session; this process only copies and
  commits, and the caller cleans up on failure;
- ``--table``: re-snapshot only these tables into a lake that already has commits, in a
  temporary slot's snapshot (or one handed in), without touching the drain's slot or other tables;
- ``--resolve [--consistent-point]``: print where the lake stands (read only): how many commits,
  the consistent point of its snapshot of ``--slot``, whether the one at ``--consistent-point``
  is committed, and the consistent points of snapshots killed before their commit
  (``uncommitted_snapshots``: copies still staged, or tables published without a commit).

Every mode but ``--resolve`` holds the lake's writer lock (``hooks.locks``) for its whole run, so
it never writes beside a drain of the same slot.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.lake import Lake

from airflow_pglogrepl.spark import app
from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.spark.snapshot_engine import ENGINES, SPARK_ABOVE_BYTES

SNAPSHOT_ENV = "PGLOGREPL_SNAPSHOT_NAME"  # the exported snapshot's name, instead of the argument
log = logging.getLogger("airflow_pglogrepl.snapshot")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="snapshot_app",
        description="Copy published tables into a Parquet lake at a replication slot's "
        f"consistent point. The source connection is read from ${DSN_ENV}.",
    )
    parser.add_argument("--slot", required=True, help="the drain's logical slot (pgoutput)")
    parser.add_argument(
        "--publication", nargs="+", action="extend", default=[], help="publication name(s)"
    )
    app.add_lake_argument(parser, writes="Spark")
    parser.add_argument(
        "--tasks-per-table", type=int, default=None, help="at most this many ranges per table "
        "(default: Spark's default parallelism)",
    )  # fmt: skip
    parser.add_argument(
        "--rows-per-task", type=int, default=1_000_000, help="about this many rows per range"
    )
    parser.add_argument("--parallelism", type=int, default=4, help="tables copied at once")
    parser.add_argument(
        "--engine", choices=ENGINES, default="auto", help="what copies the tables: this process "
        "(no Spark), Spark, or (auto) this process for tables up to --spark-above-mib",
    )  # fmt: skip
    parser.add_argument(
        "--spark-above-mib", type=app.non_negative_int, default=SPARK_ABOVE_BYTES >> 20,
        help="with --engine "
        "auto, a table whose heap is bigger than this is copied on Spark; smaller ones without",
    )  # fmt: skip
    parser.add_argument(
        "--lock-timeout", type=float, default=60.0, help="seconds to wait, in all, for the "
        "ACCESS SHARE locks the copy holds on its tables",
    )  # fmt: skip
    parser.add_argument(
        "--snapshot-name", default=None,
        help=f"exported snapshot held by the caller (or ${SNAPSHOT_ENV})",
    )  # fmt: skip
    parser.add_argument(
        "--consistent-point", default=None, help="the slot's consistent point (with a handed "
        "snapshot, or with --resolve)",
    )  # fmt: skip
    parser.add_argument(
        "--table", action="append", default=None, help="re-snapshot only this table "
        "(schema.table; repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--failover", choices=("auto", "on", "off"), default="auto", help="standalone: create "
        "the slot as a failover slot, synchronized to standbys (auto: on a primary of "
        "PostgreSQL 17 or later)",
    )  # fmt: skip
    parser.add_argument(
        "--replace-slot", action="store_true", help="standalone: drop and re-create the slot "
        "when it exists and the lake holds no commit yet (a slot left by a killed run)",
    )  # fmt: skip
    parser.add_argument(
        "--resolve", action="store_true", help="report where the lake stands (read only): "
        "its commits, its snapshot's consistent point, and what killed snapshots left",
    )  # fmt: skip
    app.add_state_vectors_argument(parser)
    args = parser.parse_args(argv)
    args.snapshot_name = args.snapshot_name or os.environ.get(SNAPSHOT_ENV) or None
    if not args.resolve and not args.publication:
        parser.error("--publication is required")
    if bool(args.snapshot_name) != bool(args.consistent_point) and not args.resolve:
        parser.error("--snapshot-name and --consistent-point go together")
    if args.replace_slot and (args.snapshot_name or args.table):
        parser.error("--replace-slot only applies to a standalone initial snapshot")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    return app.run_app(
        "snapshot_app",
        "InitialSnapshotOperator",
        lambda dsn: run(args, dsn, started),
        logger="airflow_pglogrepl.snapshot",
    )


def run(args: argparse.Namespace, dsn: str, started: float) -> dict[str, Any]:
    from airflow_pglogrepl.lake import create_only, storage
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.postgres.source import PgSource

    storage.use_for_lake(args.lake_root)
    # a store that would let two writers commit one version is refused before anything starts
    create_only.require_conditional_create(args.lake_root)
    hook = PgSource(dsn)
    lazy = app.LazySpark("pglogrepl-snapshot")
    spark = lazy.get
    try:
        lake = Lake(args.lake_root, args.slot, state_deletion_vectors=args.state_deletion_vectors)
        if args.resolve:
            from airflow_pglogrepl.lake.snapshots import resolve
            from airflow_pglogrepl.lsn import LSN

            point = LSN(args.consistent_point) if args.consistent_point else None
            return {"resolved": True, **resolve(lake, point)}
        with hook.writer_lock(args.slot, role="snapshot") as lock:
            lake.writer_check = lock.check
            if args.table:
                result = _tables(args, hook, lake, spark)
            elif args.snapshot_name:
                result = _handed(args, hook, lake, spark)
            else:
                result = _standalone(args, hook, lake, spark)
        result["startup_s"] = round(time.monotonic() - started, 3)
        result.update(lazy.summary())
        return result
    finally:
        lazy.stop()


def _copy(args: argparse.Namespace, hook: Any, lake: Lake, spark: Any, point: Any) -> Any:
    from airflow_pglogrepl.spark.snapshot import SnapshotCopy
    from airflow_pglogrepl.tables import parse_tables

    return SnapshotCopy(
        spark=spark,
        lake=lake,
        reader_params=hook.connection_params(),
        point=point,
        publications=args.publication,
        tables=parse_tables(args.table) if args.table else None,
        tasks_per_table=args.tasks_per_table,
        rows_per_task=args.rows_per_task,
        parallelism=args.parallelism,
        lock_timeout_s=args.lock_timeout,
        engine=args.engine,
        spark_above_bytes=args.spark_above_mib << 20,
    ).run()


def _handed(args: argparse.Namespace, hook: Any, lake: Lake, spark: Any) -> dict[str, Any]:
    """The caller holds the exporting session: copy and commit, nothing else."""
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.spark.snapshot import SnapshotPoint

    point = SnapshotPoint(args.slot, LSN(args.consistent_point), args.snapshot_name)
    slot = hook.get_slot(args.slot, plugin="pgoutput")
    if slot.confirmed_flush_lsn != point.consistent_point:
        raise ValueError(
            f"slot {args.slot!r} is at {slot.confirmed_flush_lsn}, not at the consistent point "
            f"{point.consistent_point} the snapshot was exported at: it is not the slot that "
            f"exported this snapshot, or it was consumed since"
        )
    result: dict[str, Any] = _copy(args, hook, lake, spark, point).to_dict()
    return result


def _spark_first(args: argparse.Namespace, hook: Any, spark: Any) -> None:
    """Start Spark now if a table will be copied on it: before the slot, so the exporting
    session waits for no JVM (``spark.snapshot_engine``)."""
    from airflow_pglogrepl.spark.snapshot_engine import spark_needed
    from airflow_pglogrepl.tables import parse_tables

    tables = parse_tables(args.table) if args.table else None
    if spark_needed(hook, args.publication, tables, engine=args.engine,
                    above=args.spark_above_mib << 20):  # fmt: skip
        spark()


def _standalone(args: argparse.Namespace, hook: Any, lake: Lake, spark: Any) -> dict[str, Any]:
    """Create the slot and hold its exporting session here; drop the slot if the copy fails."""
    from airflow_pglogrepl.exceptions import SlotNotFoundError
    from airflow_pglogrepl.lake.snapshots import (
        bootstrap_plan,
        check_empty_lake,
        resolve,
        snapshot_committed,
    )
    from airflow_pglogrepl.spark.snapshot import SnapshotPoint

    try:
        hook.get_slot(args.slot)
        exists = True
    except SlotNotFoundError:
        exists = False
    plan = bootstrap_plan(slot=args.slot, slot_exists=exists, status=resolve(lake),
                          lake=args.lake_root, replace_slot=args.replace_slot)  # fmt: skip
    if plan.action == "exists":
        log.info("lake already holds the snapshot of slot %s at %s", args.slot, plan.snapshot_lsn)
        return {"status": "exists", "committed": True, "mode": "initial",
                "slot": args.slot, "consistent_point": plan.snapshot_lsn, "rows": 0}  # fmt: skip
    if plan.action == "replace_slot":
        hook.drop_slot(args.slot)
    check_empty_lake(lake)
    _spark_first(args, hook, spark)
    failover = {"auto": None, "on": True, "off": False}[args.failover]
    exported = hook.create_slot_with_snapshot(args.slot, failover=failover)
    point = SnapshotPoint(exported.slot, exported.consistent_point, exported.snapshot_name)
    try:
        result: dict[str, Any] = _copy(args, hook, lake, spark, point).to_dict()
    except BaseException:
        exported.close()
        if not snapshot_committed(lake, point.consistent_point):
            log.warning("snapshot failed before its commit: dropping slot %s", args.slot)
            hook.drop_slot(args.slot, missing_ok=True)
        raise
    finally:
        exported.close()
    return result


def _tables(args: argparse.Namespace, hook: Any, lake: Lake, spark: Any) -> dict[str, Any]:
    """Re-snapshot some tables in a temporary slot's snapshot (or a handed one)."""
    from airflow_pglogrepl.lake.snapshots import temporary_slot_name
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.spark.snapshot import SnapshotPoint

    hook.get_slot(args.slot, plugin="pgoutput")  # the drain's slot must exist
    if args.snapshot_name:
        point = SnapshotPoint(args.slot, LSN(args.consistent_point), args.snapshot_name)
        result: dict[str, Any] = _copy(args, hook, lake, spark, point).to_dict()
        return result
    _spark_first(args, hook, spark)
    with hook.create_slot_with_snapshot(temporary_slot_name(args.slot), temporary=True) as held:
        point = SnapshotPoint(args.slot, held.consistent_point, held.snapshot_name)
        result = _copy(args, hook, lake, spark, point).to_dict()
    return result


if __name__ == "__main__":
    sys.exit(main())
