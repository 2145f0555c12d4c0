"""Drain benchmark: the whole drain, end to end, beside the server's own decode rate.

Loads the decoder benchmark's workload (1,000,000 inserts and 250,000 updates of a 4-column
table, in transactions of 10,000 rows) into a throwaway cluster, captured by a publication and by
several pgoutput slots all created before the load (each consuming run needs its own), then
measures on the same WAL:

- the server: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)`` (WAL reading,
  reorder buffer and pgoutput; nothing shipped to a client);
- ``pg_recvlogical`` streaming the same changes to a file (``--endpos`` at the end of the load):
  PostgreSQL's own client, for scale;
- the drain's stages in this process, each run adding one step to the one before: the hook's
  fetch (``peek_changes``), + pgoutput decoding, + the per-table changelog batches (values as
  Python objects), + Arrow tables, + plain Parquet files (snappy, fsynced: the lake's former
  write, the baseline) and, instead of that, + the Delta append (the lake's window API: the
  same files, fsynced, then one Delta commit per window through delta-rs);
- the real drain: ``python -m airflow_pglogrepl.spark.drain_app ... --no-materialize`` (a local
  lake, so no JVM), split into its fixed start-up cost and its steady-state window rate, once
  per reader (``--readers``): the replication stream and the peek, side by side;
- once each, the same with the merge into an empty ``state/``: the first state written without
  a JVM (the default) and by Spark (``--small-merge-rows 0``), for the materialize time
  (``--materialize-only`` measures just these and the server's decode).

The server, stage and drain runs alternate (best of ``--repeat``) so all meet the same load on a
shared machine. Not a test: run it with ``python -m bench.bench_drain`` and record the result in
docs/benchmarks.md. ``--profile`` adds a cProfile of the Delta stage.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_pglogrepl.changelog.columnar import ColumnarDecoder
from airflow_pglogrepl.changelog.rows import ChangelogBatch
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import Change, PgOutputStream
from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, local_cluster

BATCH = 10_000
PEEK_SLOT = "bench_peek"  # only ever peeked: the server and stage runs share it
STAGES = ("fetch", "decode", "batches", "arrow", "parquet", "delta",
          "adbc", "columnar", "columnar_delta")  # fmt: skip
STAGE_LABELS = {
    "fetch": "reference: hook fetch (psycopg `peek_changes`)",
    "decode": "reference: + pgoutput decode (per message)",
    "batches": "reference: + changelog batches (Python values)",
    "arrow": "reference: + Arrow tables",
    "parquet": "reference: + plain Parquet files (snappy, fsync; before Delta)",
    "delta": "reference: + Delta append instead (files, fsync, one commit per window)",
    "adbc": "columnar: ADBC fetch (`peek_arrow`, Arrow batches)",
    "columnar": "columnar: + columnar decode into changelog tables",
    "columnar_delta": "columnar: + Delta append (files, fsync, one commit)",
}


def parquet_file(table: Any, directory: str) -> None:
    """The lake's former changelog write: one Parquet file, fsynced with its directory entry."""
    import uuid

    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, f"part-{uuid.uuid4().hex}.parquet")
    pq.write_table(table, target, compression="snappy")
    for synced in (target, directory):
        fd = os.open(synced, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load(conn: Any, inserts: int, updates: int) -> None:
    """The decoder benchmark's workload, in transactions of ``BATCH`` rows."""
    for first in range(1, inserts + 1, BATCH):
        conn.execute(
            "INSERT INTO bench SELECT g, g %% 1000, 'row ' || g, now()"
            " FROM generate_series(%s::bigint, %s) g",
            (first, min(first + BATCH - 1, inserts)),
        )
    for first in range(1, updates + 1, BATCH):
        conn.execute(
            "UPDATE bench SET qty = qty + 1, label = label || '!' WHERE id BETWEEN %s AND %s",
            (first, min(first + BATCH - 1, updates)),
        )


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def stage(
    hook: DsnReplicationHook, options: dict[str, str], upto: LSN, level: str, batch_rows: int
) -> int:
    """The drain's steps up to ``level`` over the whole load, as ``Drain._window`` runs them
    (without the commit record and the slot advance); returns the changes seen (for
    ``fetch``, the rows: changes plus Begin, Commit and Relation messages)."""
    if level in ("adbc", "columnar", "columnar_delta"):
        return columnar_stage(hook, options, upto, level)
    rows = hook.peek_changes(PEEK_SLOT, upto_lsn=upto, options=options, batch_rows=batch_rows)
    if level == "fetch":
        return sum(1 for _ in rows)
    events = PgOutputStream.from_options(options).decode(rows)
    if level == "decode":
        return sum(1 for event in events if event.__class__ is Change)
    with tempfile.TemporaryDirectory(prefix="bench-drain-write-") as out:
        window = Window(Lake(out, "bench"), LSN(0))

        def finish(batch: ChangelogBatch) -> None:
            if level == "arrow":
                batch.to_arrow()
            elif level == "parquet":
                parquet_file(batch.to_arrow(), os.path.join(out, str(batch.ref)))
            elif level == "delta":
                window.write(batch.ref, batch.to_arrow())

        batches: dict[int, ChangelogBatch] = {}
        changes = 0
        for event in events:
            if event.__class__ is Change:
                change: Change = event
                batch = batches.get(id(change.table))
                if batch is None:
                    batch = batches[id(change.table)] = ChangelogBatch(change.table)
                batch.add(change, change.seq)
                changes += 1
                if len(batch) >= batch_rows:
                    finish(batch)
                    batches[id(change.table)] = ChangelogBatch(change.table)
        for batch in batches.values():
            if len(batch):
                finish(batch)
        if level == "delta":
            window.commit(upto, transactions=0, changes=changes)
    return changes


def columnar_stage(hook: DsnReplicationHook, options: dict[str, str], upto: LSN, level: str) -> int:
    """The columnar path's steps up to ``level``; returns the messages (``adbc``) or changes."""
    batches = hook.peek_arrow(PEEK_SLOT, upto_lsn=upto, options=options)
    if level == "adbc":
        return sum(len(batch) for batch in batches)
    decoder = ColumnarDecoder(options)
    changes = 0
    with tempfile.TemporaryDirectory(prefix="bench-drain-columnar-") as out:
        window = Window(Lake(out, "bench"), LSN(0))
        for batch in batches:
            for piece in decoder.feed(batch):
                changes += piece.rows.num_rows
                if level == "columnar_delta":
                    table = piece.table
                    window.write(TableRef(table.schema, table.table), piece.rows)
        if level == "columnar_delta":
            window.commit(upto, transactions=0, changes=changes)
    return changes


def recvlogical(cluster: PgCluster, slot: str, end: LSN, out: Path) -> float:
    """Seconds for pg_recvlogical to stream the slot's changes up to ``end`` into ``out``."""
    env = {**os.environ, "PGPASSWORD": cluster.password}
    command = [
        str(cluster.bindir / "pg_recvlogical"),
        "-h", cluster.host, "-p", str(cluster.port), "-U", cluster.superuser, "-d", "postgres",
        "--slot", slot, "--start", "--no-loop", "--endpos", str(end), "-f", str(out),
        "-o", "proto_version=1", "-o", "publication_names=bench",
    ]  # fmt: skip
    seconds, result = timed(
        lambda: subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    )
    if result.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({result.returncode}):\n{result.stderr}")
    return float(seconds)


def drain_app(
    cluster: PgCluster,
    slot: str,
    window: int,
    batch_rows: int,
    *,
    materialize: bool,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One run of the drain application in its own process; its JSON summary plus wall_s."""
    with tempfile.TemporaryDirectory(prefix="bench-drain-lake-") as lake_root:
        command = [
            sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", slot,
            "--publication", "bench", "--lake", lake_root, "--max-window-bytes", str(window),
            "--batch-rows", str(batch_rows), *extra,
        ]  # fmt: skip
        if not materialize:
            command.append("--no-materialize")
        env = {**os.environ, DSN_ENV: cluster.dsn()}
        seconds, result = timed(
            lambda: subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        )
    if result.returncode != 0:
        raise RuntimeError(f"drain_app failed ({result.returncode}):\n{result.stderr[-4000:]}")
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    summary["wall_s"] = seconds
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inserts", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window-mb", type=int, default=64, help="--max-window-bytes, in MiB")
    parser.add_argument("--batch-rows", type=int, default=200_000)
    parser.add_argument("--profile", action="store_true", help="cProfile the Delta stage")
    parser.add_argument("--readers", default="auto,stream,peek",
                        help="the drain's --reader values to compare")  # fmt: skip
    parser.add_argument(
        "--materialize-only",
        action="store_true",
        help="only the server decode and the two drain runs with materialize",
    )
    args = parser.parse_args()
    window = args.window_mb * 1024 * 1024
    repeat = args.repeat
    merges = {  # label -> drain_app arguments: the first state without a JVM, and by Spark
        "first state without a JVM (default)": ("bench_materialize", ()),
        "first state by Spark (--small-merge-rows 0)": ("bench_materialize_spark",
                                                        ("--small-merge-rows", "0")),
    }  # fmt: skip
    recv_slots = [f"bench_recv_{i}" for i in range(repeat)]
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    drain_slots = {r: [f"bench_drain_{r}_{i}" for i in range(repeat)] for r in readers}
    all_drain_slots = [slot for slots in drain_slots.values() for slot in slots]

    with (
        local_cluster("bench-drain", LOGICAL_SETTINGS) as cluster,
        cluster.connect() as conn,
        tempfile.TemporaryDirectory(prefix="bench-drain-recv-") as recv_dir,
    ):
        conn.execute(
            "CREATE TABLE bench (id bigint PRIMARY KEY, qty int, label text, at timestamptz)"
        )
        conn.execute("CREATE PUBLICATION bench FOR TABLE bench")
        for slot in [PEEK_SLOT, *recv_slots, *all_drain_slots,
                     *(s for s, _ in merges.values())]:  # fmt: skip
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        start_lsn = LSN(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        started = time.perf_counter()
        load(conn, args.inserts, args.updates)
        end = LSN(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        print(f"loaded {args.inserts:,} inserts + {args.updates:,} updates "
              f"({(end - start_lsn) / 2**20:,.0f} MiB of WAL) "
              f"in {time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip

        hook = DsnReplicationHook(cluster.dsn())
        options = {"proto_version": "1", "publication_names": '"bench"', "messages": "false"}
        count_sql = (
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL,"
            " 'proto_version', '1', 'publication_names', 'bench')"
        )
        best: dict[str, float] = {}
        drains: dict[str, list[dict[str, Any]]] = {r: [] for r in readers}
        messages = changes = 0
        recv_bytes = 0

        def keep(label: str, seconds: float) -> None:
            best[label] = min(best.get(label, float("inf")), seconds)

        if args.materialize_only:
            for _ in range(repeat):
                seconds, messages = timed(
                    lambda: conn.execute(count_sql, (PEEK_SLOT, str(end))).fetchone()[0]
                )
                keep("server", seconds)
        for i in range(0 if args.materialize_only else repeat):
            seconds, messages = timed(
                lambda: conn.execute(count_sql, (PEEK_SLOT, str(end))).fetchone()[0]
            )
            keep("server", seconds)
            out = Path(recv_dir) / f"recv_{i}.bin"
            keep("recvlogical", recvlogical(cluster, recv_slots[i], end, out))
            recv_bytes = out.stat().st_size
            out.unlink()
            for level in STAGES:
                seconds, counted = timed(
                    lambda level=level: stage(hook, options, end, level, args.batch_rows)
                )
                keep(level, seconds)
                if level in ("fetch", "adbc"):
                    assert counted == messages, (level, counted, messages)
                    continue
                changes = changes or counted
                assert counted == changes, (level, counted, changes)
            for reader in readers:
                done = drain_app(cluster, drain_slots[reader][i], window, args.batch_rows,
                                 materialize=False, extra=("--reader", reader))  # fmt: skip
                assert done["changes"] == changes, (done, changes)
                assert reader == "auto" or done["reader"] == reader, done
                drains[reader].append(done)
            print(f"run {i + 1}/{repeat} done", flush=True)
        materialized = {
            label: drain_app(cluster, slot, window, args.batch_rows, materialize=True,
                             extra=extra)
            for label, (slot, extra) in merges.items()
        }  # fmt: skip
        changes = changes or next(iter(materialized.values()))["changes"]
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(stage, hook, options, end, "delta", args.batch_rows)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)

    server_rate = changes / best["server"]
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nchanges: {changes:,} ({int(messages):,} pgoutput messages); "
          f"cores: {os.cpu_count()}; load average: {load_avg}; "
          f"window {args.window_mb} MiB, batch rows {args.batch_rows:,}")  # fmt: skip

    def line(label: str, seconds: float) -> None:
        rate = changes / seconds
        print(f"| {label} | {seconds:.2f} s | {rate:,.0f} | {rate / server_rate:.2f} |")

    print(f"\nserver decode (best of {repeat}): {best['server']:.2f} s")
    print("\n| drain_app with materialize, into an empty state | wall s | Spark start s | "
          "materialize s | peak RSS MiB | end to end / server decode |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for label, done in materialized.items():
        print(f"| {label} | {done['wall_s']:.2f} | {done.get('spark_start_s') or 0:.2f} | "
              f"{done.get('materialize_s', 0):.2f} | {done.get('peak_rss_mb', 0):,.0f} | "
              f"{best['server'] / done['wall_s']:.2f} |")  # fmt: skip
    if args.materialize_only:
        return
    print(f"\n| stage (best of {repeat}) | time | changes/s | ratio to server |")
    print("|---|---:|---:|---:|")
    line("server decode (`count(*)` over the peek)", best["server"])
    line(f"pg_recvlogical to a file ({recv_bytes / 2**20:,.0f} MiB)", best["recvlogical"])
    for level in STAGES:
        line(STAGE_LABELS[level], best[level])
    write_before = best["parquet"] - best["arrow"]
    write_now = best["delta"] - best["arrow"]
    print(f"\nwrite cost alone (stage minus Arrow tables): Parquet {write_before:.2f} s, "
          f"Delta {write_now:.2f} s; Delta over the whole stage: "
          f"{(best['delta'] / best['parquet'] - 1) * 100:+.1f}%")  # fmt: skip

    for reader in readers:
        drain_table(reader, drains[reader], repeat, server_rate)


def drain_table(reader: str, drains: list[dict[str, Any]], repeat: int, server_rate: float) -> None:
    """The drain application's runs with one reader, as a table."""
    steady = max(drains, key=lambda d: d["changes_per_s"])
    quickest = min(drains, key=lambda d: d["wall_s"])
    window_s = steady["changes"] / steady["changes_per_s"]
    print(f"\n| drain_app --reader {reader} (best of {repeat}) | value |")
    print("|---|---:|")
    if reader == "auto":
        print(f"| reader used, and why | {steady['reader']}: {steady['reader_note']} |")
    print(f"| wall time, process start to exit (--no-materialize) | {quickest['wall_s']:.2f} s |")
    print(f"| start-up inside the app (checks, lock, reconcile) | "
          f"{min(d['startup_s'] for d in drains):.2f} s |")  # fmt: skip
    fixed = quickest["wall_s"] - quickest["changes"] / quickest["changes_per_s"]
    print(f"| fixed cost: wall time - window time (interpreter, imports, start-up, exit) | "
          f"{fixed:.2f} s |")  # fmt: skip
    print(f"| windows | {steady['windows']} |")
    print(f"| window time (sum) | {window_s:.2f} s |")
    print(f"| steady-state rate (changes / window time) | {steady['changes_per_s']:,.0f} /s |")
    print(f"| **ratio steady-state drain / server decode** | "
          f"**{steady['changes_per_s'] / server_rate:.2f}** |")  # fmt: skip
    print(f"| peak RSS of the drain | {min(d['peak_rss_mb'] for d in drains):,.0f} MiB |")


if __name__ == "__main__":
    main()
