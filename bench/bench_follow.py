"""Continuous mode benchmark: a following drain (``--follow``) under a steady pgbench write load,
its freshness (commit on the source to readable in ``changes/``, and with ``--merge-seconds`` in
``state/`` too) and its CPU per change.

pgbench's TPC-B-like script runs at a fixed rate (``--rate``, transactions per second) for
``--seconds``; each of its transactions updates three tables and inserts into a fourth, all
published. The drain follows the slot with a window every ``--window-seconds`` (local lake,
``--no-materialize``; with ``--merge-seconds``, the states merged that often while it follows)
and ends once pgbench has finished and it has caught up. CPU is read
from the kernel: the drain's own (its summary) and its walsender's (``/proc``), both over the
changes it stored. Not a test: ``python -m bench.bench_follow``; the result goes to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, local_cluster
from airflow_pglogrepl.testing.wait import wait_until

TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1000, help="pgbench transactions per second")
    parser.add_argument("--seconds", type=int, default=60, help="how long pgbench writes")
    parser.add_argument("--window-seconds", default="1", help="the drain's --window-seconds")
    parser.add_argument("--scale", type=int, default=10, help="pgbench -i scale")
    parser.add_argument("--merge-seconds", default=None, help="merge state/ this often while "
                        "following (default: no merge; changes/ alone)")  # fmt: skip
    args = parser.parse_args()
    with local_cluster("bench-follow", dict(LOGICAL_SETTINGS)) as cluster:
        pgbench = cluster.bindir / "pgbench"
        if not pgbench.exists():
            sys.exit(f"{pgbench} is missing: this benchmark needs a cluster with pgbench")
        env = {**os.environ, "PGPASSWORD": cluster.password}
        target = ["-h", cluster.host, "-p", str(cluster.port), "-U", cluster.superuser, "postgres"]
        subprocess.run([str(pgbench), "-i", "-q", "-s", str(args.scale), *target], env=env,
                       check=True, capture_output=True)  # fmt: skip
        with cluster.connect() as conn:
            conn.execute(f"CREATE PUBLICATION bench FOR TABLE {', '.join(TABLES)}")
            conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
        with tempfile.TemporaryDirectory(prefix="bench-follow-") as lake_root:
            run = follow(cluster, lake_root, args.window_seconds, args.seconds,
                         args.merge_seconds)  # fmt: skip
            walsender = wait_until(lambda: _walsender_pid(cluster), what="the walsender")
            assert walsender is not None
            server_cpu = process_cpu_s(walsender)
            load = subprocess.run(
                [str(pgbench), "-n", "-c", "4", "-j", "2", "-R", str(args.rate), "-T",
                 str(args.seconds), *target],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            with cluster.connect() as conn:  # caught up: the slot confirmed past the load
                flushed = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
                wait_until(lambda: conn.execute(
                    "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots "
                    "WHERE slot_name = 'bench'", (flushed,)).fetchone()[0],
                    what="the drain catching up", timeout=600)  # fmt: skip
            server_cpu = process_cpu_s(walsender) - server_cpu
            run.send_signal(15)
            out, err = run.communicate(timeout=300)
            if run.returncode != 0:
                raise RuntimeError(f"drain_app failed ({run.returncode}):\n{err[-4000:]}")
            result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    tps = re.search(r"tps = ([\d.]+)", load.stdout)
    fresh, changes = result["follow"]["freshness"], result["changes"]
    print(f"\ncores: {os.cpu_count()}; load average: "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; pgbench -R {args.rate} for "
          f"{args.seconds} s (scale {args.scale}): {tps.group(1) if tps else '?'} tps; "
          f"window every {args.window_seconds} s")  # fmt: skip
    print("\n| windows | transactions | changes | freshness p50 | p99 | max | drain CPU per "
          "change | walsender CPU per change |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {result['windows']} | {fresh['transactions']:,} | {changes:,} | "
          f"{fresh['p50_s']} s | {fresh['p99_s']} s | {fresh['max_s']} s | "
          f"{result['follow']['cpu_s'] / max(changes, 1) * 1e6:.0f} µs | "
          f"{server_cpu / max(changes, 1) * 1e6:.0f} µs |")  # fmt: skip
    state = result["follow"].get("state_freshness") or {}
    if args.merge_seconds is not None:
        print(f"\nstate/ merged every {args.merge_seconds} s while following: "
              f"{result['follow']['merges']} merges")  # fmt: skip
        print("\n| transactions | state freshness p50 | p99 | max |")
        print("|---:|---:|---:|---:|")
        print(f"| {state.get('transactions', 0):,} | {state.get('p50_s')} s | "
              f"{state.get('p99_s')} s | {state.get('max_s')} s |")  # fmt: skip


def follow(cluster: PgCluster, lake_root: str, window_s: str, seconds: int,
           merge_s: str | None) -> Any:  # fmt: skip
    """The drain application following slot ``bench``, started and reading."""
    merging = ["--merge-seconds", merge_s] if merge_s is not None else ["--no-materialize"]
    command = [
        sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", "bench",
        "--publication", "bench", "--lake", lake_root, *merging, "--follow",
        "--window-seconds", window_s, "--follow-for", str(seconds * 20),
    ]  # fmt: skip
    return subprocess.Popen(command, env={**os.environ, DSN_ENV: cluster.dsn()},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _walsender_pid(cluster: PgCluster) -> int | None:
    with cluster.connect() as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'bench' "
                           "AND active").fetchone()  # fmt: skip
    return int(row[0]) if row else None


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
