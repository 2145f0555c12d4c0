"""Pinned ``restart_lsn`` benchmark: a drain behind a session that wrote and stays idle in its
transaction, through the stream and through the peek, beside one server decode of the backlog.

A slot's ``restart_lsn`` moves only past the oldest transaction still running, so one open
transaction pins it, and every peek decodes the whole backlog from there again: a run of many
windows decodes it once per window. The stream decodes each WAL record once. The workload: a
session inserts one row and stays open; other sessions then write ``--wal-mb`` of WAL in
published transactions; each drain run (``--no-materialize``, local lake) drains it all in
windows of ``--window-mb``. Not a test: ``python -m bench.bench_pinned``; the result goes to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import time

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster
from bench.bench_drain import drain_app, timed

ROWS_PER_TRANSACTION = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wal-mb", type=int, default=300, help="WAL written behind the pin")
    parser.add_argument("--window-mb", type=int, default=16, help="--max-window-bytes, in MiB")
    parser.add_argument("--readers", default="auto,stream,peek")
    args = parser.parse_args()
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    window = args.window_mb << 20
    settings = {**LOGICAL_SETTINGS, "max_wal_size": "4GB"}
    with local_cluster("bench-pinned", settings) as cluster, cluster.connect() as conn:
        conn.execute("CREATE TABLE t (id bigserial PRIMARY KEY, pad text)")
        conn.execute("CREATE PUBLICATION bench FOR TABLE t")
        for slot in ["bench_server", *(f"bench_{r}" for r in readers)]:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        with cluster.connect() as pin:
            pin.autocommit = False
            pin.execute("INSERT INTO t (pad) VALUES ('pinned')")  # open, and stays so
            start = LSN(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
            began = time.perf_counter()
            while True:
                conn.execute("INSERT INTO t (pad) SELECT repeat('w', 200) "
                             "FROM generate_series(1, %s)", (ROWS_PER_TRANSACTION,))  # fmt: skip
                now = LSN(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
                if now - start >= args.wal_mb << 20:
                    break
            end = LSN(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
            print(f"{(end - start) / 2**20:,.0f} MiB of WAL behind an open transaction, written "
                  f"in {time.perf_counter() - began:.1f} s", flush=True)  # fmt: skip
            server_s, changes = timed(lambda: conn.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench_server', %s::"
                "pg_lsn, NULL, 'proto_version', '1', 'publication_names', 'bench')",
                (str(end),)).fetchone()[0])  # fmt: skip
            runs = {}
            for reader in readers:
                runs[reader] = drain_app(cluster, f"bench_{reader}", window, 200_000,
                                         materialize=False, extra=("--reader", reader))  # fmt: skip
                assert reader == "auto" or runs[reader]["reader"] == reader, runs[reader]
            pin.rollback()
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\ncores: {os.cpu_count()}; load average: {load_avg}; window {args.window_mb} MiB; "
          f"{changes:,} pgoutput messages in one server decode")  # fmt: skip
    print("\n| run | windows | changes | wall s | one server decode / wall |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| server decode of the backlog (`count(*)` over one peek) | | | {server_s:.2f} | 1.00 |"
    )
    for reader, run in runs.items():
        used = f" ({run['reader']})" if reader == "auto" else ""
        print(f"| drain_app --reader {reader}{used} | {run['windows']} | {run['changes']:,} | "
              f"{run['wall_s']:.2f} | {server_s / run['wall_s']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
