"""Spark application: drain a logical slot into a Delta Lake lake in bounded LSN windows.

Run it as ``spark-submit drain_app.py ARGS`` (any master) or ``python -m
airflow_pglogrepl.spark.drain_app ARGS`` (local Spark). The source database comes from the
environment variable ``PGLOGREPL_SOURCE_DSN`` (libpq conninfo or URI), never from the command
line, where ``ps`` and Spark's UI would show it. The last line on stdout is one JSON object with
what the run did; a failure exits non-zero with the reason on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from airflow_pglogrepl.spark import app
from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.spark.backfill import DEFAULT_CHUNK_ROWS


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="drain_app",
        description="Drain a logical replication slot into a Delta Lake lake, exactly once. "
        f"The source connection is read from ${DSN_ENV}.",
    )
    parser.add_argument("--slot", required=True, help="logical slot (plugin pgoutput)")
    parser.add_argument(
        "--publication", required=True, nargs="+", action="extend", help="publication name(s)"
    )
    app.add_lake_argument(parser, writes="Delta")
    parser.add_argument(
        "--max-window-bytes", type=int, default=64 * 1024 * 1024, help="WAL bytes per window"
    )
    parser.add_argument(
        "--max-windows", type=int, default=None, help="stop after this many windows"
    )
    parser.add_argument(
        "--no-materialize", action="store_true", help="skip merging changes into state/"
    )
    parser.add_argument(
        "--batch-rows", type=int, default=200_000, help="rows per table per changelog file"
    )
    parser.add_argument(
        "--merge-parallelism", type=int, default=4, help="tables merged into state/ at once"
    )
    parser.add_argument(
        "--small-merge-rows", type=int, default=100_000, help="a table's batch of at most this "
        "many changes is merged without a JVM when it can be (0: every merge by Spark)",
    )  # fmt: skip
    parser.add_argument(
        "--merge-stall-seconds", type=float, default=600.0, help="a table's Spark merge with no "
        "progress for this long (a job running, no task active or finishing) is cancelled and "
        "fails the run, which releases the writer lock (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--accept-source-change", action="store_true", help="the lake's source changed on "
        "purpose (pg_upgrade gives a new system identifier; a promotion of the lake's own server "
        "needs no flag): drain on, and record the new source",
    )  # fmt: skip
    parser.add_argument(
        "--on-quarantine", choices=("fail", "warn"), default="fail", help="tables in the "
        "lake's quarantine (their changes could not be stored; every other table went on), "
        "or whose state the WAL could not keep equal to the source (a table added to the "
        "publication, a partition attached or detached): exit failed naming them (fail), or "
        "only say so (warn)",
    )  # fmt: skip
    _add_repair_arguments(parser)
    parser.add_argument(
        "--reader", choices=("auto", "stream", "peek"), default="auto", help="read the slot "
        "through the replication protocol (stream: the role needs REPLICATION), through "
        "pg_logical_slot_peek_* (peek), or per run (auto: peeks for a backlog, the stream when "
        "following or behind a pinned restart_lsn)",
    )  # fmt: skip
    parser.add_argument(
        "--follow", action="store_true", help="keep reading the slot: commit a window every "
        "--window-seconds while changes come (or every --max-window-bytes of WAL), until "
        "SIGTERM or SIGINT (the window is committed, then the run ends well) or --follow-for",
    )  # fmt: skip
    parser.add_argument(
        "--window-seconds", type=_positive_seconds, default=5.0, help="with --follow: seconds "
        "between window commits, the changes' freshness in changes/ (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--merge-seconds", type=_positive_seconds, default=30.0, help="with --follow: merge "
        "state/ (and the histories kept) every this many seconds while following, after a "
        "window's commit (the run's end merges once more)",
    )  # fmt: skip
    parser.add_argument(
        "--follow-for", type=_positive_seconds, default=None, metavar="SECONDS",
        help="with --follow: end the run after this long (default: until stopped)",
    )  # fmt: skip
    app.add_state_vectors_argument(parser)
    args = parser.parse_args(argv)
    if not args.follow and args.follow_for is not None:
        parser.error("--follow-for bounds a following run: add --follow")
    return args


def _add_repair_arguments(parser: argparse.ArgumentParser) -> None:
    """What a run does about tables the WAL could not keep equal to the source."""
    parser.add_argument(
        "--on-incomplete", choices=("backfill", "resnapshot", "report"), default="backfill",
        help="a table the WAL could not keep equal to the source (added to the publication "
        "holding rows, a partition attached or detached): copy it again in chunks while the "
        "drain goes on, its state replaced whole when done (backfill; a table without a key is "
        "re-snapshotted), re-snapshot it whole in this run before draining (resnapshot: the "
        "role needs REPLICATION), or only name it (report)",
    )  # fmt: skip
    parser.add_argument(
        "--history", action="append", default=[], metavar="TABLE", help="keep history/<table>,"
        " every version of each row (SCD type 2), for this table ('*': every table; repeat "
        "for several)",
    )  # fmt: skip
    parser.add_argument(
        "--history-spark-bytes", type=int, default=None, metavar="BYTES", help="a history "
        "whose files pass this many bytes ends its versions by a Spark MERGE (deletion vectors"
        ") instead of delta-rs' rewrite of the files holding them (default 256 MiB; 0: always "
        "on Spark)",
    )  # fmt: skip
    parser.add_argument(
        "--resync", action="append", default=[], metavar="TABLE", help="copy this table again "
        "while the drain goes on, and replace its state whole when done: rows the lake holds "
        "that the source has not are removed (repeat for several)",
    )  # fmt: skip
    parser.add_argument(
        "--parity", action="append", default=[], metavar="TABLE", help="check this table's "
        "state against the source at the same position (copied in chunks while the drain "
        "goes on, like a backfill): the keys missing, extra or different are counted and "
        "named in the summary's parity, and the run fails if any (repeat for several)",
    )  # fmt: skip
    parser.add_argument(
        "--parity-repair", action="store_true", help="with --parity: a state found different "
        "is replaced by what the check read (the run then only warns)",
    )  # fmt: skip
    parser.add_argument(
        "--backfill-chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, metavar="ROWS",
        help=f"rows a backfill's chunk reads, about (default {DEFAULT_CHUNK_ROWS:,})",
    )  # fmt: skip
    parser.add_argument(
        "--accept-incomplete", action="append", default=[], metavar="TABLE", help="a table "
        "the lake reports as differing from its source (added to the publication holding "
        "rows, a partition attached or detached): accept the difference and stop reporting "
        "it (repeat for several)",
    )  # fmt: skip


def _positive_seconds(text: str) -> float:
    seconds = float(text)
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return seconds


def _stop_on_signals(follow: Any) -> None:
    """SIGTERM (Airflow's kill of the task) and SIGINT (a terminal's Ctrl-C) end a following
    run after its current window: that window is committed, the slot confirmed, the summary
    printed. A second signal ends it at once, as a crash would (nothing is lost: the next run
    goes on from what the lake committed)."""
    import signal

    def stop(signum: int, frame: object) -> None:
        if follow.stop_requested:
            raise SystemExit(128 + signum)
        logging.getLogger("airflow_pglogrepl.drain").warning(
            "%s: committing the current window, then stopping (send it again to stop now)",
            signal.Signals(signum).name,
        )  # fmt: skip
        follow.request_stop()  # a flag only: no lock may be taken in a signal handler

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    return app.run_app(
        "drain_app",
        "SlotDrainOperator",
        lambda dsn: run(args, dsn, started),
        logger="airflow_pglogrepl.drain",
    )


def run(args: argparse.Namespace, dsn: str, started: float) -> dict[str, Any]:
    from airflow_pglogrepl.lake import create_only, storage
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.pipeline.drain import Drain, check_slot
    from airflow_pglogrepl.pipeline.follow import Follow
    from airflow_pglogrepl.pipeline.results import peak_rss_mb
    from airflow_pglogrepl.postgres.source import PgSource

    follow = None
    if args.follow:
        follow = Follow(window_s=args.window_seconds, seconds=args.follow_for,
                        max_windows=args.max_windows, merge_s=args.merge_seconds,
                        stop_on_quarantine=args.on_quarantine == "fail")  # fmt: skip
        _stop_on_signals(follow)

    storage.use_for_lake(args.lake_root)
    # a store that would let two writers commit one version is refused before anything starts
    create_only.require_conditional_create(args.lake_root)
    source = PgSource(dsn)
    spark = app.LazySpark("pglogrepl-drain")
    try:
        with source.writer_lock(args.slot, role="drain") as lock:
            # Refused early, nothing started yet; after the lock, so that a run that finds
            # another streaming the slot names that run (LakeWriterBusyError), not its PID.
            lake = Lake(
                args.lake_root, args.slot, origins=source.column_origins, writer_check=lock.check,
                state_deletion_vectors=args.state_deletion_vectors,
            )  # fmt: skip
            check_slot(source, args.slot, lake)
            if follow is not None and not args.no_materialize:  # state/ fresh while following
                follow.merge = lambda: _merge_states(args, spark, lake)
            repair = _repair(args, spark, source, lake)
            drain = Drain(
                source=source,
                lake=lake,
                slot=args.slot,
                publications=args.publication,
                max_window_bytes=args.max_window_bytes,
                max_windows=args.max_windows,
                accept_source_change=args.accept_source_change,
                accept_incomplete=args.accept_incomplete,
                repair=repair,
                batch_rows=args.batch_rows,
                reader=args.reader,
                follow=follow,
            )
            result = drain.run(started).to_dict()
            if not args.no_materialize:
                began = time.monotonic()
                result["drain_peak_rss_mb"] = result.get("peak_rss_mb")  # before the merge
                result["materialized"] = _materialized(args, spark, lake)
                result["materialize_s"] = round(time.monotonic() - began, 3)
                result["peak_rss_mb"] = peak_rss_mb()  # a merge without a JVM holds its batch
            if args.history:
                result.update(_history(args, spark, lake))
            result["table_versions"] = _table_versions(lake, result)
        result.update(spark.summary())
        _report_incomplete(args, result)
        _report_drift(args, result)
        if result.get("quarantined"):
            from airflow_pglogrepl.exceptions import QuarantinedTablesError

            error = QuarantinedTablesError(args.lake_root, result["quarantined"])
            if args.on_quarantine == "fail":
                raise error
            logging.getLogger("airflow_pglogrepl.drain").warning(
                "%s: %s", type(error).__name__, error
            )
        return result
    finally:
        spark.stop()


def _materialized(args: argparse.Namespace, spark: Any, lake: Any) -> dict[str, str]:
    """Every state behind the lake's position merged: table -> the LSN it includes now."""
    from airflow_pglogrepl.merge.materialize import materialize, pending_tables

    tables = pending_tables(lake)  # Spark starts only if some state is behind
    if not tables:
        return {}
    return materialize(spark.get, lake, tables=tables, parallelism=args.merge_parallelism,
                       small_rows=args.small_merge_rows,
                       stall_seconds=args.merge_stall_seconds)  # fmt: skip


def _merge_states(args: argparse.Namespace, spark: Any, lake: Any) -> None:
    """A following run's merge between windows: the states, then the histories it keeps."""
    _materialized(args, spark, lake)
    if args.history:
        _history(args, spark, lake)


def _history(args: argparse.Namespace, spark: Any, lake: Any) -> dict[str, Any]:
    """Each history asked for brought up to the lake's position, after the states (on Spark,
    started then, only where a big history's versions end)."""
    from airflow_pglogrepl.merge.history import history_tables, merge_history

    began = time.monotonic()
    wanted: bool | list[str] = True if "*" in args.history else list(args.history)
    merged = merge_history(lake, history_tables(lake, wanted), spark=spark.get,
                           spark_bytes=args.history_spark_bytes)  # fmt: skip
    return {"history": merged, "history_s": round(time.monotonic() - began, 3)}


def _table_versions(lake: Any, result: dict[str, Any]) -> dict[str, int]:
    """``kind/table`` -> the Delta version the run left each table it changed at: what the
    table's Asset event says (``operators.assets.table_events``)."""
    from airflow_pglogrepl.lake import delta
    from airflow_pglogrepl.lake.layout import table_dir
    from airflow_pglogrepl.tables import TableRef

    names = set(result.get("tables") or {}) | set(result.get("backfills") or {})
    found = {}
    for name in sorted(table_dir(TableRef.parse(n)) for n in names):
        for kind, uri in (("changes", lake.paths.changes(name)), ("state", lake.paths.state(name)),
                          ("history", lake.paths.history(name))):  # fmt: skip
            table = delta.open_table(uri)
            if table is not None:
                found[f"{kind}/{name}"] = int(table.version())
    return found


def _repair(args: argparse.Namespace, spark: Any, source: Any, lake: Any) -> Any:
    """What the run does about tables the WAL could not keep equal to the source, and the
    resyncs and parity checks asked for (``pipeline.repair``)."""
    from airflow_pglogrepl.spark.backfill import OnlineBackfill
    from airflow_pglogrepl.spark.resnapshot import Resnapshot

    resnapshot = Resnapshot(spark=spark.get, source=source, lake=lake, slot=args.slot,
                            publications=args.publication)  # fmt: skip
    return OnlineBackfill(
        spark=spark.get, source=source, lake=lake, slot=args.slot,
        publications=args.publication, fallback=resnapshot, on_gaps=args.on_incomplete,
        resync=args.resync, parity=args.parity, parity_repair=args.parity_repair,
        chunk_rows=args.backfill_chunk_rows,
    )  # fmt: skip


def _report_drift(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Tables a parity check found different and did not repair: the run fails naming them,
    or warns (``--on-quarantine warn``); a repaired one is only said."""
    from airflow_pglogrepl.exceptions import LakeDriftError

    found = {t: f for t, f in (result.get("parity") or {}).items() if not f.get("equal")}
    drifted = {t: f for t, f in found.items() if not f.get("repaired")}
    log = logging.getLogger("airflow_pglogrepl.drain")
    for table, what in found.items():
        if what.get("repaired"):
            log.warning("%s differed from its source and was replaced by what the check read: "
                        "%s", table, what)  # fmt: skip
    if drifted:
        error = LakeDriftError(args.lake_root, drifted)
        if args.on_quarantine == "fail":
            raise error
        log.warning("%s: %s", type(error).__name__, error)


def _report_incomplete(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Tables whose state may differ from the source (``pipeline.coverage``): the run fails
    naming them, or warns (``--on-quarantine warn``); a table no longer published only warns."""
    from airflow_pglogrepl.exceptions import LakeIncompleteError
    from airflow_pglogrepl.pipeline.coverage import WARN_ONLY

    gaps = result.get("incomplete") or {}
    failing = {t: g for t, g in gaps.items() if g["reason"] not in WARN_ONLY}
    if failing and args.on_quarantine == "fail":
        raise LakeIncompleteError(args.lake_root, failing)


if __name__ == "__main__":
    sys.exit(main())
