"""Online backfill benchmark: rows/s of a table added to the publication and backfilled while
the drain goes on, beside the whole-table re-snapshot and ``psql``'s ``COPY``, and the drain's
lag while it runs.

Loads a table ``bench`` (``bigint``, ``int``, ``text``, ``timestamptz``, the snapshot
benchmark's shape) into a throwaway cluster; a lake drains a small table ``a`` first. Then:

- ``psql -c "COPY bench TO STDOUT" > /dev/null``: the yardstick;
- the re-snapshot of ``bench`` (``on_incomplete="resnapshot"``): the drain run that copies it
  whole before it reads the slot;
- the backfill (``on_incomplete="backfill"``): the drain run that copies it in chunks of
  ``--chunk-rows`` while a writer commits ``--writes-per-s`` single-row inserts into ``a``.
  Meanwhile a thread samples the lake every 0.1 s: the longest time the lake's position did not
  move while the writer wrote (the drain's lag in seconds) and the most WAL bytes the lake was
  behind the source's flushed position.

Each line is one drain run on a ``local[2]`` Spark session (warmed up first), on a fresh lake.
Not a test: ``python -m bench.bench_backfill``; record results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster
from bench.bench_table import load_bench_table, psql_copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--chunk-rows", type=int, default=500_000)
    parser.add_argument("--writes-per-s", type=float, default=50.0)
    args = parser.parse_args()

    from airflow_pglogrepl.hooks.replication import DsnReplicationHook
    from airflow_pglogrepl.spark.session import local_session

    with local_cluster("bench-backfill", LOGICAL_SETTINGS) as cluster:
        heap = load_bench_table(cluster, args.rows)
        with cluster.connect() as conn:
            conn.execute("CREATE TABLE a (id bigserial PRIMARY KEY, at timestamptz)")
        hook = DsnReplicationHook(cluster.dsn())
        began = time.perf_counter()
        psql_copy(cluster)
        results: list[tuple[str, float, str]] = [
            ("psql `COPY bench TO STDOUT > /dev/null`", time.perf_counter() - began, "")
        ]
        spark = local_session("bench-backfill", cores=2)
        workdir = tempfile.mkdtemp(prefix="bench-backfill-")
        try:
            run(cluster, hook, spark, workdir, "resnapshot", args)  # warms the JVM and workers
            for how in ("resnapshot", "backfill"):
                seconds, lag = run(cluster, hook, spark, workdir, how, args)
                results.append((f"drain run with `on_incomplete={how!r}`", seconds, lag))
        finally:
            spark.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.rows:,} rows, heap {heap / 1e6:,.1f} MB, chunks of {args.chunk_rows:,} rows, "
          f"writer {args.writes_per_s:g} inserts/s into another table\n")  # fmt: skip
    print("| | time | rows/s | ratio to psql | while it ran |")
    print("|---|---:|---:|---:|---|")
    for label, seconds, lag in results:
        ratio = results[0][1] / seconds
        print(f"| {label} | {seconds:.2f} s | {args.rows / seconds:,.0f} | {ratio:.2f} | {lag} |")


def run(cluster: Any, hook: Any, spark: Any, workdir: str, how: str,
        args: argparse.Namespace) -> tuple[float, str]:  # fmt: skip
    """One fresh lake: ``a`` drained, ``bench`` added, then the measured run."""
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.pipeline.drain import Drain
    from airflow_pglogrepl.spark.backfill import OnlineBackfill
    from airflow_pglogrepl.spark.resnapshot import Resnapshot

    slot, lake_root = f"bench_{how}", os.path.join(workdir, how)
    shutil.rmtree(lake_root, ignore_errors=True)
    with cluster.connect() as conn:
        conn.execute("DROP PUBLICATION IF EXISTS bench")
        conn.execute("CREATE PUBLICATION bench FOR TABLE a")
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    lake = Lake(lake_root, slot, origins=hook.column_origins)

    def drain() -> Any:
        whole = Resnapshot(spark=lambda: spark, source=hook, lake=lake, slot=slot,
                           publications=["bench"])  # fmt: skip
        repair = OnlineBackfill(spark=lambda: spark, source=hook, lake=lake, slot=slot,
                                publications=["bench"], fallback=whole, on_gaps=how,
                                chunk_rows=args.chunk_rows)  # fmt: skip
        with hook.writer_lock(slot) as lock:
            lake.writer_check = lock.check
            drain = Drain(source=hook, lake=lake, slot=slot, publications=["bench"],
                          max_window_bytes=16 << 20, repair=repair)  # fmt: skip
            return drain.run(time.monotonic())

    drain()
    with cluster.connect() as conn:
        conn.execute("ALTER PUBLICATION bench ADD TABLE bench")
    watch = Watch(cluster, hook, lake, args.writes_per_s)
    watch.start()
    began = time.perf_counter()
    try:
        result = drain()
    finally:
        watch.stop()
    seconds = time.perf_counter() - began
    assert result.incomplete == {}, result.incomplete
    return seconds, watch.describe()


class Watch:
    """A writer into ``a`` and a sampler of how far the lake is behind, while a run goes on."""

    def __init__(self, cluster: Any, hook: Any, lake: Any, writes_per_s: float) -> None:
        self.cluster, self.hook, self.lake = cluster, hook, lake
        self.interval = 1.0 / writes_per_s
        self.done = threading.Event()
        self.stalled_s = 0.0
        self.behind_bytes = 0
        self.threads = [threading.Thread(target=self._write, daemon=True),
                        threading.Thread(target=self._sample, daemon=True)]  # fmt: skip

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join()

    def describe(self) -> str:
        return (f"lake still for {self.stalled_s:.1f} s at most while the writer wrote; "
                f"at most {self.behind_bytes / 1e6:.1f} MB of WAL behind")  # fmt: skip

    def _write(self) -> None:
        with self.cluster.connect() as conn:
            while not self.done.wait(self.interval):
                conn.execute("INSERT INTO a (at) VALUES (now())")

    def _sample(self) -> None:
        last, since = self.lake.position(), time.monotonic()
        while not self.done.wait(0.1):
            position = self.lake.position()
            now = time.monotonic()
            if position != last:
                last, since = position, now
            self.stalled_s = max(self.stalled_s, now - since)
            if position is not None:
                behind = int(self.hook.flush_lsn()) - int(position)
                self.behind_bytes = max(self.behind_bytes, behind)


if __name__ == "__main__":
    main()
