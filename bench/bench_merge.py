"""Merge benchmark: what a materialize costs as the state grows, MERGE against a full rewrite.

Builds a state of ``--small`` and of ``--large`` rows (a 4-column table keyed by ``id``) and one
changelog batch of ``--changes`` changes at random keys (70% updates, 15% deletes, 15% inserts
of new keys), then measures, on local[2] Spark with the lake's session settings:

- the lake's merge: ``net_changes`` + ``apply`` (one Delta ``MERGE INTO`` with deletion vectors),
  into a fresh copy of each Delta state;
- the former merge (``merge_state`` as of ``BEFORE``, read from git): the whole new state
  computed with a full outer join and rewritten as Parquet, as every materialize did before
  the lake became Delta.

The goal it checks: the large case costs at most 2x the small one, and at most a quarter of
the full rewrite of the large table. Not a test: ``python -m bench.bench_merge``; the result
goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BEFORE = "50717da"  # the last commit of the Parquet lake
REPO = Path(__file__).resolve().parent.parent


def former_merge_state() -> Any:
    """``merge_state`` as the Parquet lake had it, loaded from git beside today's modules."""
    import airflow_pglogrepl.changelog.columns as changelog

    sys.modules.setdefault("airflow_pglogrepl.spark.changelog", changelog)
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:airflow_pglogrepl/spark/merge.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp(prefix="bench-merge-before-")) / "former_merge.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("former_merge", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.merge_state


def state_frame(spark: Any, rows: int) -> Any:
    return spark.range(1, rows + 1).selectExpr(
        "id", "cast(id % 1000 as int) as qty", "concat('label ', id) as label",
        "timestamp'2026-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) as at",
    )  # fmt: skip


def changes_frame(spark: Any, rows: int, count: int, seed: int = 7) -> Any:
    from airflow_pglogrepl.changelog.columns import (
        COMMIT_LSN,
        COMMIT_TS,
        OLD,
        OP,
        SEQ,
        UNCHANGED,
        XID,
    )  # fmt: skip

    rng = random.Random(seed)
    keys = rng.sample(range(1, rows + 1), int(count * 0.85))
    data = []
    lsn = 0x10_0000
    for n, key in enumerate(keys):
        op = "D" if n % 100 < 18 else "U"  # of 85%: about 15% deletes, 70% updates
        data.append((key, n, f"changed {n}", op, lsn + n, 1))
    for n in range(count - len(keys)):
        data.append((rows + 1 + n, n, f"new {n}", "I", lsn + len(keys) + n, 1))
    frame = spark.createDataFrame(data, "id long, qty int, label string, op string, l long, s long")
    return frame.selectExpr(
        "id", "if(op = 'D', null, qty) as qty", "if(op = 'D', null, label) as label",
        "if(op = 'D', null, timestamp'2026-06-01 00:00:00') as at",
        f"op as {OP}", f"l as {COMMIT_LSN}", f"s as {SEQ}", f"l as {XID}",
        f"timestamp'2026-06-01 00:00:00' as {COMMIT_TS}",
        f"cast(array() as array<string>) as {UNCHANGED}",
        f"cast(null as struct<id:long,qty:int,label:string,at:timestamp>) as {OLD}",
    )  # fmt: skip


def timed(run: Any) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=500_000)
    parser.add_argument("--large", type=int, default=5_000_000)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from airflow_pglogrepl.merge.materialize import apply
    from airflow_pglogrepl.merge.reduce import net_changes
    from airflow_pglogrepl.spark.session import local_session

    spark = local_session("bench-merge", cores=2, **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    former = former_merge_state()
    columns = ["id", "qty", "label", "at"]
    work = Path(tempfile.mkdtemp(prefix="bench-merge-"))
    results: dict[int, dict[str, float]] = {}
    try:
        for rows in (args.small, args.large):
            base_delta, base_parquet = work / f"base-{rows}", work / f"parquet-{rows}"
            state_frame(spark, rows).write.format("delta").option(
                "delta.enableDeletionVectors", "true").save(str(base_delta))  # fmt: skip
            state_frame(spark, rows).write.parquet(str(base_parquet))
            changes = changes_frame(spark, rows, args.changes).cache()
            changes.count()
            merge_s, rewrite_s = [], []
            for i in range(args.repeat):
                target = work / f"merge-{rows}-{i}"
                shutil.copytree(base_delta, target)  # a fresh state each time

                def merge(target: Path = target, changes: Any = changes) -> None:
                    session = spark.newSession()
                    net = net_changes(
                        changes, session.read.format("delta").load(str(target)),
                        key=["id"], columns=columns, table="bench",
                    )  # fmt: skip
                    apply(session, net, str(target), app="bench", version=1)

                merge_s.append(timed(merge))
                out = work / f"rewrite-{rows}-{i}"

                def rewrite(
                    out: Path = out, changes: Any = changes, base_parquet: Path = base_parquet
                ) -> None:
                    previous = spark.read.parquet(str(base_parquet))
                    merged = former(previous, changes, key=["id"], columns=columns)
                    merged.write.mode("overwrite").parquet(str(out))

                rewrite_s.append(timed(rewrite))
                shutil.rmtree(target, ignore_errors=True)
                shutil.rmtree(out, ignore_errors=True)
            results[rows] = {"merge": min(merge_s), "rewrite": min(rewrite_s)}
            print(f"{rows:,} rows: MERGE {min(merge_s):.2f} s, full rewrite "
                  f"{min(rewrite_s):.2f} s (best of {args.repeat})", flush=True)  # fmt: skip
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    small, large = results[args.small], results[args.large]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{args.changes:,} changes at random keys; local[2], shuffle partitions 2; "
          f"best of {args.repeat}; load average {load}\n")  # fmt: skip
    print(
        "| state rows | Delta MERGE (deletion vectors) | full rewrite (before) | MERGE / rewrite |"
    )
    print("|---:|---:|---:|---:|")
    for rows, r in results.items():
        print(f"| {rows:,} | {r['merge']:.2f} s | {r['rewrite']:.2f} s | "
              f"{r['merge'] / r['rewrite']:.2f} |")  # fmt: skip
    print(f"\nMERGE {args.large:,} / MERGE {args.small:,}: "
          f"{large['merge'] / small['merge']:.2f} (goal: at most 2)")  # fmt: skip
    print(f"MERGE {args.large:,} / full rewrite {args.large:,}: "
          f"{large['merge'] / large['rewrite']:.2f} (goal: at most 0.25)")  # fmt: skip


if __name__ == "__main__":
    main()
