"""Big transaction benchmark: the drain's peak memory for one transaction far bigger than a
window, through the stream and through the peek.

A transaction of ``--rows`` rows (about 350 bytes of WAL each) after a small one of a tenth of
that, drained with 1 MiB windows and 5,000-row batches, as
``test_transaction_larger_than_window_drains_whole_in_flat_memory`` does: each reader drains the
small one, then the big one, in runs of their own; the table shows each run's peak RSS and wall
time. Not a test: ``python -m bench.bench_big_transaction``; the result goes to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster
from bench.bench_drain import drain_app

FILL = "INSERT INTO t SELECT g, repeat(md5(g::text), 10) FROM generate_series(%s::int, %s) g"


def one_run(cluster: Any, reader: str) -> dict[str, Any]:
    return drain_app(cluster, f"bench_{reader}", 1 << 20, 5_000, materialize=False,
                     extra=("--reader", reader))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--readers", default="stream,peek")
    args = parser.parse_args()
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    small = args.rows // 10
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in readers}
    with local_cluster("bench-big", LOGICAL_SETTINGS) as cluster, cluster.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION bench FOR TABLE t")
        for reader in readers:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                         (f"bench_{reader}",))  # fmt: skip
        conn.execute(FILL, (1, small))
        for reader in readers:
            runs[reader].append(one_run(cluster, reader))
        conn.execute(FILL, (small + 1, small + args.rows))
        for reader in readers:
            runs[reader].append(one_run(cluster, reader))
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\ncores: {os.cpu_count()}; load average: {load_avg}; 1 MiB windows, 5,000-row batches")
    print("\n| reader | transaction | windows | peak RSS MiB | wall s |")
    print("|---|---:|---:|---:|---:|")
    for reader, (first, second) in runs.items():
        for run, rows in ((first, small), (second, args.rows)):
            print(f"| {reader} | {rows:,} rows | {run['windows']} | {run['peak_rss_mb']:,.0f} | "
                  f"{run['wall_s']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
