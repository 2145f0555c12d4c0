"""Snapshot benchmark: rows/s and MB/s copying one table into the lake, in process and on Spark.

Loads a 5,000,000-row table (``bigint``, ``int``, ``text``, ``timestamptz``, the decoder
benchmark's shape) into a throwaway cluster, then measures:

- ``psql -c "COPY bench TO STDOUT" > /dev/null``: what the server and libpq deliver to one
  client that does nothing with the rows, the yardstick;
- ``CopyTask`` alone, one range, in this process: the session, the ADBC read (binary COPY into
  Arrow, in C) and the conversion to the lake's Arrow types, without Spark;
- ``SnapshotCopy`` in this process (``engine="process"``: no Spark, Parquet written by pyarrow,
  the commit by the lake) with 1 and with 2 ranges read on threads;
- ``SnapshotCopy`` on a ``local[2]`` Spark session with 1 and with 2 tasks for the table: the
  whole snapshot (ranges, COPY, Arrow, Parquet written by Spark, footer count, commit), each in a
  temporary slot's exported snapshot and a fresh lake;
- Spark writing the same rows, made in memory by one task (``mapInArrow``), into a Delta table
  with and without Delta's per-file statistics, and into plain Parquet: the writer's own cost,
  which bounds a snapshot task from below.

MB/s is the table's heap size (``pg_relation_size``) over the time, the same numerator for every
line. Spark's Python workers are started by a warm-up run first. Each figure is the best of
``--repeat`` runs. Not a test: ``python -m bench.bench_snapshot``; record results in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster
from bench.bench_table import load_bench_table, psql_copy


def best_of(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """(shortest wall time, its result) over ``repeat`` runs."""
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        value = run()
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, result = elapsed, value
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from airflow_pglogrepl.hooks.replication import DsnReplicationHook
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.postgres.passfile import travelling_params
    from airflow_pglogrepl.postgres.snapshot import SnapshotReader
    from airflow_pglogrepl.spark.range_copy import BlockRange, CopyTask
    from airflow_pglogrepl.spark.session import local_session
    from airflow_pglogrepl.spark.snapshot import SnapshotCopy, SnapshotPoint

    Hook = DsnReplicationHook  # noqa: N806 (it includes the snapshot statements)

    with local_cluster("bench-snapshot", LOGICAL_SETTINGS) as cluster:
        heap = load_bench_table(cluster, args.rows)
        with cluster.connect() as conn:
            conn.execute("CREATE PUBLICATION bench FOR TABLE bench")
        mb = heap / 1e6
        hook = Hook(cluster.dsn())
        results: list[tuple[str, float]] = []
        text_bytes = len(psql_copy(cluster, out=subprocess.PIPE) or b"")

        def run_psql() -> None:
            psql_copy(cluster)

        results.append(
            ("psql `COPY bench TO STDOUT > /dev/null`", best_of(args.repeat, run_psql)[0])
        )

        def in_process() -> int:
            with hook.create_slot_with_snapshot("bench_inproc", temporary=True) as held:
                reader = SnapshotReader(hook.connection_params())
                with reader.transaction(held.snapshot_name) as conn:
                    (table,) = reader.published_tables(conn, ["bench"])
                with travelling_params(hook.connection_params()) as params:
                    task = CopyTask(params, held.snapshot_name, table)
                    return sum(batch.num_rows for batch in task.copy(BlockRange(0, None)))

        seconds, rows = best_of(args.repeat, in_process)
        assert rows == args.rows, rows
        results.append(("`CopyTask` alone, 1 range, no Spark (ADBC -> lake Arrow)", seconds))

        workdir = tempfile.mkdtemp(prefix="bench-snapshot-")

        def snapshot_in_process(ranges: int) -> dict[str, Any]:
            target = os.path.join(workdir, "in-process")
            shutil.rmtree(target, ignore_errors=True)
            with hook.create_slot_with_snapshot("bench_process", temporary=True) as held:
                point = SnapshotPoint(held.slot, held.consistent_point, held.snapshot_name)
                result = SnapshotCopy(
                    spark=None, lake=Lake(target, held.slot), engine="process",
                    reader_params=hook.connection_params(), point=point, publications=["bench"],
                    tasks_per_table=ranges, rows_per_task=1,
                ).run()  # fmt: skip
            summary = result.to_dict()
            assert summary["rows"] == args.rows, summary
            return summary

        for ranges in (1, 2):
            seconds, summary = best_of(args.repeat, lambda r=ranges: snapshot_in_process(r))
            results.append(
                (f"`SnapshotCopy` in process, no Spark, {ranges} range(s) "
                 f"(copy {summary['copy_s']:.2f} s)", seconds)
            )  # fmt: skip

        spark = local_session("bench-snapshot", cores=2)

        def snapshot(tasks: int) -> dict[str, Any]:
            target = os.path.join(workdir, "lake")
            shutil.rmtree(target, ignore_errors=True)
            with hook.create_slot_with_snapshot("bench_spark", temporary=True) as held:
                point = SnapshotPoint(held.slot, held.consistent_point, held.snapshot_name)
                result = SnapshotCopy(
                    spark=lambda: spark, lake=Lake(target, held.slot),
                    reader_params=hook.connection_params(), point=point, publications=["bench"],
                    tasks_per_table=tasks, rows_per_task=1, engine="spark",
                ).run()  # fmt: skip
            summary = result.to_dict()
            assert summary["rows"] == args.rows, summary
            return summary

        try:
            began = time.perf_counter()
            snapshot(2)  # starts the Python workers and warms the JVM
            warmup = time.perf_counter() - began
            for tasks in (1, 2):
                seconds, summary = best_of(args.repeat, lambda t=tasks: snapshot(t))
                results.append(
                    (f"`SnapshotCopy`, local[2] Spark, {tasks} task(s) "
                     f"(copy {summary['copy_s']:.2f} s)", seconds)
                )  # fmt: skip
            for label, fmt, stats in (
                ("Spark alone: the same rows from memory, 1 task, into Delta", "delta", "true"),
                ("Spark alone: the same, Delta without per-file statistics", "delta", "false"),
                ("Spark alone: the same, into plain Parquet", "parquet", "true"),
            ):
                spark.conf.set("spark.databricks.delta.stats.collect", stats)
                target = os.path.join(workdir, fmt)
                seconds = best_of(
                    args.repeat, lambda f=fmt, t=target: write_only(spark, f, t, args.rows)
                )[0]
                results.append((label, seconds))
            spark.conf.unset("spark.databricks.delta.stats.collect")
        finally:
            spark.stop()
            shutil.rmtree(workdir, ignore_errors=True)

        print(
            f"\n{args.rows:,} rows, heap {mb:,.1f} MB, COPY text {text_bytes / 1e6:,.1f} MB; "
            f"best of {args.repeat}; first Spark run (worker start-up) {warmup:.1f} s\n"
        )
        print("| | time | rows/s | MB/s (heap) |")
        print("|---|---:|---:|---:|")
        for label, seconds in results:
            print(
                f"| {label} | {seconds:.2f} s | {args.rows / seconds:,.0f} | {mb / seconds:.1f} |"
            )


def write_only(spark: Any, fmt: str, target: str, rows: int) -> None:
    """Spark's write of ``rows`` rows of the benchmark's shape, made by one Python task."""

    def make(_: Any) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        step = 180_000
        for first in range(1, rows + 1, step):
            ids = pa.array(np.arange(first, min(first + step, rows + 1), dtype=np.int64))
            yield pa.record_batch(
                [ids, pc.remainder(ids, 1000),
                 pc.binary_join_element_wise("label ", ids.cast(pa.string()), ""),
                 pc.add(pc.multiply(ids, 1_000_000), 1_767_225_600_000_000).cast(
                     pa.timestamp("us", tz="UTC"))],
                names=["id", "qty", "label", "at"],
            )  # fmt: skip

    shutil.rmtree(target, ignore_errors=True)
    one = spark.createDataFrame([(0,)], "x long").coalesce(1)
    frame = one.mapInArrow(make, "id long, qty long, label string, at timestamp")
    frame.write.format(fmt).mode("overwrite").save(target)


if __name__ == "__main__":
    main()
