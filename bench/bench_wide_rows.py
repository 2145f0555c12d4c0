"""Wide rows benchmark: peak memory of ``drain_app`` with its defaults for rows of 16 KiB.

``--rows`` rows (default 40,000) of 16 KiB of text stored uncompressed, drained into a new lake
(the first state, written without a JVM), then every row updated once and drained again into the
same lake (a keyed batch into an existing state). The table shows each run's WAL, wall time,
merge time, the drain application's peak RSS after the drain and after the merge (its own
process; a Spark merge's JVM is not counted), and whether the state then equals the source.
Not a test: ``python -m bench.bench_wide_rows``; the result goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster

FILL = (
    "INSERT INTO t SELECT g, (SELECT string_agg(md5(random()::text || g || s), '') "
    "FROM generate_series(1, 512) s) FROM generate_series(%s::int, %s) g"
)


def run(dsn: str, lake: str, extra: list[str]) -> dict[str, Any]:
    """One ``drain_app`` run with its defaults (and ``extra``), in its own process."""
    command = [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", "bench",
               "--publication", "bench", "--lake", lake, *extra]  # fmt: skip
    began = time.monotonic()
    result = subprocess.run(command, env={**os.environ, DSN_ENV: dsn}, capture_output=True,
                            text=True, check=False)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"drain_app failed ({result.returncode}):\n{result.stderr[-4000:]}")
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    summary["wall_s"] = time.monotonic() - began
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--reader", default=None, help="drain_app --reader (default: its own)")
    args = parser.parse_args()
    extra = [] if args.reader is None else ["--reader", args.reader]
    rows: list[tuple[str, float, dict[str, Any]]] = []
    with local_cluster("bench-wide", LOGICAL_SETTINGS) as cluster, cluster.connect() as conn, \
            tempfile.TemporaryDirectory(prefix="bench-wide-lake-") as lake:  # fmt: skip
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("ALTER TABLE t ALTER v SET STORAGE EXTERNAL")  # 16 KiB each, uncompressed
        conn.execute("CREATE PUBLICATION bench FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
        for label, statements in (
            ("first state (inserts)", [(FILL, (a, min(a + 999, args.rows)))
                                       for a in range(1, args.rows + 1, 1000)]),
            ("every row updated once", [("UPDATE t SET v = reverse(v)", None)]),
        ):  # fmt: skip
            before = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            for statement, params in statements:
                conn.execute(statement, params)
            wal = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (before,)).fetchone()
            summary = run(cluster.dsn(), lake, extra)
            summary["equal"] = _state_equals_source(conn, lake)
            rows.append((label, float(wal[0]) / (1 << 20), summary))
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\ncores: {os.cpu_count()}; load average: {load_avg}; {args.rows:,} rows of 16 KiB")
    print("\n| run | WAL MiB | reader | wall s | merge s | merged by | peak RSS MiB: drain | "
          "after the merge | state equals source |")  # fmt: skip
    print("|---|---:|---|---:|---:|---|---:|---:|---|")
    for label, wal_mb, summary in rows:
        spark = "Spark" if summary.get("spark_start_s") else "no JVM"
        print(f"| {label} | {wal_mb:,.0f} | {summary.get('reader')} | {summary['wall_s']:.1f} | "
              f"{summary.get('materialize_s', 0):.1f} | {spark} | "
              f"{summary.get('drain_peak_rss_mb') or 0:,.0f} | "
              f"{summary.get('peak_rss_mb', 0):,.0f} | {summary['equal']} |")  # fmt: skip


def _state_equals_source(conn: Any, lake: str) -> bool:
    """Whether the lake's state of ``t`` holds the source's rows: each key and the md5 of its
    value, on both sides (the state may carry deletion vectors: read through DataFusion)."""
    from deltalake import DeltaTable, QueryBuilder

    state = DeltaTable(f"{lake}/state/public.t")
    found = QueryBuilder().register("s", state).execute("SELECT id, md5(v) AS h FROM s").read_all()
    keys, hashes = found.column("id").to_pylist(), found.column("h").to_pylist()
    lake_rows = sorted(zip(keys, hashes, strict=True))
    source = sorted(conn.execute("SELECT id, md5(v) FROM t").fetchall())
    return lake_rows == [tuple(r) for r in source]


if __name__ == "__main__":
    main()
