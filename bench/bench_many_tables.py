"""Many small tables: what a drain run spends merging a few changes into each table's state.

The issue-26 case: ``--tables`` tables of ``--rows`` rows, drained once (each table's first
state is written by Spark), then ``--changes`` changes per table (updates, deletes, inserts),
drained again: the second run's ``materialize_s`` is the figure. Two slots created before the
load drain the same WAL into two lakes, the second run once with the JVM-free merge of small
batches (the default) and once with every merge by Spark (``--small-merge-rows 0``), as
``drain_app`` processes (the product's own start-up included). Prints a table. Not a test:
``python -m bench.bench_many_tables``; results go to docs/benchmarks.md.
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

from psycopg import sql

from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster


def drain(dsn: str, slot: str, lake_root: str, *extra: str) -> dict[str, Any]:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", slot,
         "--publication", "many", "--lake", lake_root, *extra],
        env={**os.environ, DSN_ENV: dsn}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    summary["wall_s"] = round(time.perf_counter() - began, 2)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=49)
    args = parser.parse_args()
    runs = {
        "JVM-free merge of small batches": (),
        "every merge by Spark": ("--small-merge-rows", "0"),
    }
    with local_cluster("bench-many", LOGICAL_SETTINGS) as cluster, cluster.connect() as conn:
        names = [f"t{i:03d}" for i in range(args.tables)]
        for name in names:
            table = sql.Identifier(name)
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, n int)")
                         .format(table))  # fmt: skip
        conn.execute(sql.SQL("CREATE PUBLICATION many FOR TABLE {}")
                     .format(sql.SQL(", ").join(map(sql.Identifier, names))))  # fmt: skip
        slots = [f"many_{i}" for i in range(len(runs))]  # after the publication, before the rows
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for name in names:
            fill = sql.SQL("INSERT INTO {} SELECT g, md5(g::text), g FROM generate_series(1, %s) g")
            conn.execute(fill.format(sql.Identifier(name)), (args.rows,))
        with tempfile.TemporaryDirectory(prefix="bench-many-") as root:
            lake_roots = [f"{root}/lake{i}" for i in range(len(runs))]
            for slot, lake_root in zip(slots, lake_roots, strict=True):
                drain(cluster.dsn(), slot, lake_root)  # first states (Spark)
            per = args.changes
            updates, deletes = per * 3 // 5, per // 5
            for name in names:  # per table: about 60% updates, 20% deletes, 20% inserts
                table = sql.Identifier(name)
                conn.execute(sql.SQL("UPDATE {} SET n = n + 1 WHERE id <= %s").format(table),
                             (updates,))  # fmt: skip
                conn.execute(sql.SQL("DELETE FROM {} WHERE id > %s").format(table),
                             (args.rows - deletes,))  # fmt: skip
                conn.execute(sql.SQL("INSERT INTO {} SELECT g, 'new', g"
                                     " FROM generate_series(%s::int, %s) g").format(table),
                             (args.rows + 1, args.rows + per - updates - deletes))  # fmt: skip
            results = {
                label: drain(cluster.dsn(), slot, lake_root, *extra)
                for (label, extra), slot, lake_root in zip(
                    runs.items(), slots, lake_roots, strict=True
                )
            }
    print(f"\n{args.tables} tables of {args.rows} rows, then about {args.changes} changes each:"
          " the second drain run\n")  # fmt: skip
    print(f"{'merge':<34} {'changes':>8} {'materialize s':>14} {'run s':>7} {'Spark start s':>14}")
    for label, summary in results.items():
        start = summary.get("spark_start_s") or 0
        print(f"{label:<34} {summary['changes']:>8} {summary['materialize_s']:>14.2f} "
              f"{summary['wall_s']:>7.2f} {start:>14.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
