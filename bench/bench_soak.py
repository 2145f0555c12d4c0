"""Soak: many drain runs under a steady write load, each followed by the merge into ``state/``
and the lake's upkeep, as the drain DAG runs them; does the lake stay healthy?

pgbench's four tables (``-s`` scale; the accounts, branches and tellers keyed, history without
a key: inserts only) are published and written by ``pgbench`` at a fixed rate (``-R``) for the
whole soak. The slot is created before their rows are inserted, so the lake begins with its
first run, from the slot alone. Each of ``--runs`` runs, in this process, under the lake's writer
lock as the operators hold it: the drain (``Drain``), the merge (``materialize``, whose Spark
session is a function that fails: every merge of this workload must need no JVM) and, every
``--upkeep-every`` runs, the upkeep (``lake.upkeep``, the task's defaults). Printed every
``--every`` runs: the changes drained, each step's seconds, live files per table (the most of
any table, and of ``pgbench_history``'s changelog, the table growing fastest), files on disk,
and the time to read the accounts state through ``deltalake``. At the end the load stops, one
more run drains the rest, and the lake is compared with the source: every state equal to its
table, row for row (history as a multiset), every change in the changelog exactly once.

``--series FILE`` writes one JSON line per run (its start in seconds from the first, the slot's
lag before and after it, changes, each step's seconds): ``python -m bench.plot_soak FILE`` draws
the lag and throughput over the soak from it. ``--s3`` keeps the lake in a bucket of an S3 API
server on loopback (moto's standalone server, as the tests use).

Not a test: ``python -m bench.bench_soak``; the result goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from airflow_pglogrepl.lake.delta import open_table, read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import LakePaths, table_dir
from airflow_pglogrepl.lake.upkeep import upkeep
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, local_cluster

TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]
SLOT, PUBLICATION = "soak", "soak"


def no_spark() -> Any:
    raise AssertionError("a merge of this workload needed Spark")


def pgbench(cluster: PgCluster, *args: str) -> list[str]:
    return [str(cluster.bindir / "pgbench"), "-h", cluster.host, "-p", str(cluster.port),
            "-U", cluster.superuser, *args, "postgres"]  # fmt: skip


def setup(cluster: PgCluster, scale: int) -> None:
    env = {**os.environ, "PGPASSWORD": cluster.password}
    # tables and keys only: the rows come after the slot, so the drain takes them
    subprocess.run(pgbench(cluster, "-i", "-I", "dtp", "-s", str(scale)), env=env, check=True,
                   capture_output=True)  # fmt: skip
    with cluster.connect() as conn:
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        conn.execute("INSERT INTO pgbench_branches SELECT b, 0 FROM generate_series(1, %s) b",
                     (scale,))  # fmt: skip
        conn.execute("INSERT INTO pgbench_tellers SELECT t, (t - 1) / 10 + 1, 0"
                     " FROM generate_series(1, %s) t", (10 * scale,))  # fmt: skip
        conn.execute("INSERT INTO pgbench_accounts SELECT a, (a - 1) / 100000 + 1, 0, ''"
                     " FROM generate_series(1, %s) a", (100_000 * scale,))  # fmt: skip


def slot_lag(cluster: PgCluster) -> int:
    """Bytes of WAL from the slot's confirmed position to the server's current one."""
    rows = cluster.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint"
        " FROM pg_replication_slots WHERE slot_name = %s", (SLOT,),
    )  # fmt: skip
    return int(rows[0][0])


def s3_lake() -> tuple[str, Any]:
    """A bucket of an S3 API server on loopback, made the process's store; the lake's URI and
    the server (to stop)."""
    from airflow_pglogrepl.lake import storage
    from airflow_pglogrepl.testing.s3 import S3Server

    server = S3Server()
    storage.use(server.store)
    return f"s3://{server.new_bucket()}/lake", server


def live_files(uri: str) -> int:
    table = open_table(uri)
    return 0 if table is None else len(table.file_uris())


def disk_files(root: str) -> int:
    """Files (or objects) under the lake's root."""
    from pyarrow import fs

    from airflow_pglogrepl.lake.storage import filesystem

    system, base = filesystem(root)
    found = system.get_file_info(fs.FileSelector(base, recursive=True))
    return sum(1 for info in found if info.type == fs.FileType.File)


def one_run(dsn: str, lake_root: str, window: int, with_upkeep: bool) -> dict[str, float]:
    from airflow_pglogrepl.pipeline.drain import Drain
    from airflow_pglogrepl.postgres.source import PgSource

    source = PgSource(dsn)
    times: dict[str, float] = {}
    with source.writer_lock(SLOT, role="drain") as lock:
        lake = Lake(lake_root, SLOT, origins=source.column_origins, writer_check=lock.check)
        began = time.perf_counter()
        result = Drain(source=source, lake=lake, slot=SLOT, publications=[PUBLICATION],
                       max_window_bytes=window).run(time.monotonic())  # fmt: skip
        times["drain"] = time.perf_counter() - began
        times["changes"] = result.to_dict()["changes"]
        began = time.perf_counter()
        materialize(no_spark, lake)
        times["materialize"] = time.perf_counter() - began
        began = time.perf_counter()
        if with_upkeep:
            upkeep(lake_root, SLOT, writer_check=lock.check)
        times["upkeep"] = time.perf_counter() - began
    return times


def source_rows(cluster: PgCluster, table: str) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row) for row in cluster.execute(f"SELECT * FROM {table}"))  # noqa: S608


def lake_rows(lake_root: str, table: str) -> Counter[tuple[Any, ...]]:
    rows = read_table(LakePaths(lake_root).state(TableRef("public", table)))
    names = [n for n in rows.column_names if not n.startswith("_")]
    return Counter(tuple(r[n] for n in names) for r in rows.to_pylist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rate", type=int, default=50, help="pgbench transactions per second")
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--window-mb", type=int, default=16)
    parser.add_argument("--upkeep-every", type=int, default=1)
    parser.add_argument("--every", type=int, default=20, help="print every this many runs")
    parser.add_argument("--series", type=Path, help="one JSON line per run, for plot_soak")
    parser.add_argument("--s3", action="store_true", help="the lake on an S3 server on loopback")
    args = parser.parse_args()
    window = args.window_mb << 20
    with local_cluster("bench-soak", LOGICAL_SETTINGS) as cluster, \
            tempfile.TemporaryDirectory(prefix="bench-soak-") as root:  # fmt: skip
        setup(cluster, args.scale)
        lake_root, server = s3_lake() if args.s3 else (f"{root}/lake", None)
        series = args.series.open("w") if args.series else None
        started = time.monotonic()
        env = {**os.environ, "PGPASSWORD": cluster.password}
        load = subprocess.Popen(pgbench(cluster, "-n", "-c", "2", "-T", "100000", "-R",
                                        str(args.rate)), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        paths = LakePaths(lake_root)
        history = paths.changes(table_dir(TableRef("public", "pgbench_history")))
        accounts = paths.state(table_dir(TableRef("public", "pgbench_accounts")))
        print(f"{args.runs} runs, pgbench at {args.rate} tps, scale {args.scale}, upkeep every "
              f"{args.upkeep_every} run(s)\n")  # fmt: skip
        print(
            "| run | changes | drain s | materialize s | upkeep s | most live files of a "
            "table | history changelog files | files on disk | read accounts state s |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        totals: Counter[str] = Counter()
        try:
            for run in range(1, args.runs + 1):
                at, before = time.monotonic() - started, slot_lag(cluster)
                times = one_run(cluster.dsn(), lake_root, window, run % args.upkeep_every == 0)
                totals.update({k: v for k, v in times.items()})
                if series is not None:
                    series.write(json.dumps({"run": run, "at_s": round(at, 3),
                                             "lag_before": before, "lag_after": slot_lag(cluster),
                                             **times}) + "\n")  # fmt: skip
                    series.flush()
                if run % args.every and run != 1:
                    continue
                uris = [paths.changes(n) for n in Lake(lake_root, SLOT).changes_tables()]
                uris += [paths.state(n) for n in Lake(lake_root, SLOT).state_tables()]
                began = time.perf_counter()
                read_table(accounts)
                read_s = time.perf_counter() - began
                print(f"| {run} | {int(times['changes']):,} | {times['drain']:.2f} | "
                      f"{times['materialize']:.2f} | {times['upkeep']:.2f} | "
                      f"{max(map(live_files, uris))} | {live_files(history)} | "
                      f"{disk_files(lake_root):,} | {read_s:.3f} |", flush=True)  # fmt: skip
        finally:
            load.terminate()
            load.wait()
            if series is not None:
                series.close()
        final = one_run(cluster.dsn(), lake_root, window, True)
        print(f"\nafter the load: {int(final['changes']):,} changes drained; totals over "
              f"{args.runs} runs: {int(totals['changes']):,} changes, drain "
              f"{totals['drain']:.1f} s, materialize {totals['materialize']:.1f} s, upkeep "
              f"{totals['upkeep']:.1f} s")  # fmt: skip
        for table in TABLES:
            want, got = source_rows(cluster, table), lake_rows(lake_root, table)
            verdict = "equal" if want == got else f"DIFFERENT ({sum((want - got).values())} "
            if want != got:
                verdict += f"missing, {sum((got - want).values())} extra)"
            print(f"{table}: {sum(want.values()):,} rows in the source, state {verdict}")
        keys: Counter[tuple[int, int]] = Counter()
        for name in Lake(lake_root, SLOT).changes_tables():
            rows = read_table(paths.changes(name)).select(["_commit_lsn", "_seq"]).to_pylist()
            keys.update((r["_commit_lsn"], r["_seq"]) for r in rows)
        twice = sum(1 for count in keys.values() if count > 1)
        print(f"changelog: {sum(keys.values()):,} changes, {twice} stored more than once")
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
