"""Which merge path for which state: one batch of changes into states of growing size, by each
of the lake's three merge paths, through ``materialize`` itself.

A lake of one table (``id bigint`` key, ``qty int``, ``label text``, ``at timestamp``): its state
written by Spark with deletion vectors on (as a snapshot leaves it), then one window of
``--changes`` changes at random keys (70% updates, 15% deletes, 15% inserts of new keys) written
through the lake's window API. Each path merges a fresh copy of that lake:

- **delta-rs**: reduced in Arrow, one ``deltalake`` MERGE (it rewrites every file a touched key
  is in: with random keys, the whole state);
- **Arrow + Spark**: reduced in Arrow, the net change merged by Spark as a local DataFrame
  (deletion vectors);
- **Spark**: the general path, ``net_changes`` reduction and MERGE both in Spark.

``arrow_merge.MAX_STATE_BYTES`` is where ``materialize`` switches from the first to the second;
this prints the figures it was chosen by. Not a test: ``python -m bench.bench_merge_paths``;
results go to docs/benchmarks.md.

``--deletion-vectors`` measures instead what a lake without deletion vectors
(``state_deletion_vectors=False``) costs the merges that need Spark: the same batch through the
two Spark paths, into a state created with them on and one created with them off, where Spark's
MERGE rewrites every file a touched key is in instead of marking rows.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.tables import TableRef

TABLE = TableRef("public", "bench")
SNAPSHOT, START = 0x100, 0x200
COLUMNS = [
    pa.field("id", pa.int64()),
    pa.field("qty", pa.int32()),
    pa.field("label", pa.string()),
    pa.field("at", pa.timestamp("us")),
]
PATHS = {  # label -> (small_rows, MAX_STATE_BYTES)
    "delta-rs": (arrow_merge.MAX_ROWS, 1 << 62),
    "Arrow + Spark": (arrow_merge.MAX_ROWS, 0),
    "Spark": (0, arrow_merge.MAX_STATE_BYTES),
}
# --deletion-vectors: the paths that merge with Spark, into a state with and without vectors
DV_PATHS = {  # label -> (path, deletion vectors)
    "Arrow + Spark, vectors": ("Arrow + Spark", True),
    "Arrow + Spark, none": ("Arrow + Spark", False),
    "Spark, vectors": ("Spark", True),
    "Spark, none": ("Spark", False),
}


def changelog_schema() -> pa.Schema:
    return pa.schema(
        [
            *cl.mark_keys(COLUMNS, ["id"]),
            pa.field(cl.OP, pa.string()).with_metadata(cl.identity_metadata("d")),
            pa.field(cl.COMMIT_LSN, pa.int64()),
            pa.field(cl.SEQ, pa.int64()),
            pa.field(cl.XID, pa.int64()),
            pa.field(cl.COMMIT_TS, pa.timestamp("us", tz="UTC")),
            pa.field(cl.UNCHANGED, pa.list_(pa.string())),
            pa.field(cl.OLD, pa.struct(COLUMNS)),
        ]
    )


def changes(rows: int, count: int, seed: int = 7) -> pa.Table:
    import datetime as dt

    rng = random.Random(seed)
    keys = rng.sample(range(1, rows + 1), int(count * 0.85))
    keys += range(rows + 1, rows + 1 + count - len(keys))
    at = dt.datetime(2026, 6, 1)
    data: list[dict[str, Any]] = []
    for n, key in enumerate(keys):
        op = "I" if key > rows else ("D" if n % 100 < 18 else "U")
        data.append({"id": key, "qty": None if op == "D" else n,
                     "label": None if op == "D" else f"changed {n}",
                     "at": None if op == "D" else at, cl.OP: op, cl.COMMIT_LSN: START + n,
                     cl.SEQ: 0, cl.XID: START + n, cl.COMMIT_TS: None, cl.UNCHANGED: [],
                     cl.OLD: None})  # fmt: skip
    return pa.Table.from_pylist(data, schema=changelog_schema())


def build(spark: Any, root: Path, rows: int, count: int, *, vectors: bool = True) -> int:
    """The lake of the module docstring; returns its state's size in bytes."""
    lake = Lake(str(root), "bench")
    state = spark.range(1, rows + 1).selectExpr(
        "id", "cast(id % 1000 as int) as qty", "concat('label ', id) as label",
        "timestamp_ntz'2026-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) as at",
    )  # fmt: skip
    for field in cl.mark_keys(COLUMNS, ["id"]):  # the key, as a snapshot's state records it
        metadata = {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}
        if metadata:
            state = state.withMetadata(field.name, metadata)
    (
        state.write.format("delta")
        .option("delta.enableDeletionVectors", str(vectors).lower())
        .option("txnAppId", lake.app)
        .option("txnVersion", str(SNAPSHOT))
        .save(lake.paths.state(TABLE))
    )
    lake.record(kind="snapshot", start=LSN(SNAPSHOT), end=LSN(SNAPSHOT))
    window = Window(lake, LSN(START))
    window.write(TABLE, changes(rows, count))
    window.commit(LSN(START + count + 1), transactions=count, changes=count)
    return sum(f.stat().st_size for f in Path(lake.paths.state(TABLE)).glob("*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[500_000, 2_000_000, 5_000_000])
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="compare the Spark paths into states with and without deletion "
                             "vectors (module docstring)")  # fmt: skip
    args = parser.parse_args()
    paths = {label: (PATHS[path], vectors) for label, (path, vectors) in DV_PATHS.items()}
    if not args.deletion_vectors:
        paths = {label: (setting, True) for label, setting in PATHS.items()}

    from airflow_pglogrepl.spark.session import local_session

    spark = local_session("bench-merge-paths", cores=2, **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="bench-merge-paths-"))
    results: dict[int, tuple[int, dict[str, float], dict[str, str]]] = {}
    try:
        for rows in args.rows:
            bases = {}
            for vectors in sorted({v for _, v in paths.values()}, reverse=True):
                bases[vectors] = work / f"base-{rows}-{vectors}"
                size = build(spark, bases[vectors], rows, args.changes, vectors=vectors)
            best: dict[str, float] = {}
            written: dict[str, str] = {}
            for i in range(args.repeat):
                for label, ((small_rows, max_state), vectors) in paths.items():
                    copy = work / f"{label}-{i}"
                    shutil.copytree(bases[vectors], copy)
                    arrow_merge.MAX_STATE_BYTES = max_state
                    began = time.perf_counter()
                    merged = materialize(spark, Lake(str(copy), "bench"), small_rows=small_rows)
                    seconds = time.perf_counter() - began
                    assert merged == {"public.bench": str(LSN(START + args.changes + 1))}, merged
                    best[label] = min(best.get(label, float("inf")), seconds)
                    written[label] = _merge_writes(copy)
                    shutil.rmtree(copy)
            results[rows] = (size, best, written)
            print(f"{rows:,} rows done: {best}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{args.changes:,} changes at random keys; local[2]; best of {args.repeat}; "
          f"load average {load}\n")  # fmt: skip
    print("| state rows | state MiB | " + " | ".join(paths) + " |")
    print("|---:|---:|" + "---:|" * len(paths))
    for rows, (size, best, _) in results.items():
        cells = " | ".join(f"{best[label]:.2f} s" for label in paths)
        print(f"| {rows:,} | {size / 2**20:,.0f} | {cells} |")
    if args.deletion_vectors:
        print("\nwhat the merge wrote (last run): " + "; ".join(
            f"{rows:,} rows, {label}: {what}" for rows, (_, _, written) in results.items()
            for label, what in written.items()))  # fmt: skip


def _merge_writes(root: Path) -> str:
    """What the merge's commit (the state's last version) wrote: new data files and their MiB,
    and the files it kept, marked with a deletion vector instead of rewritten."""
    import json

    log = sorted(Path(root, "state", "public.bench", "_delta_log").glob("*.json"))[-1]
    adds = [a["add"] for a in map(json.loads, log.read_text().splitlines()) if "add" in a]
    marked = sum(1 for a in adds if a.get("deletionVector"))
    written = [a for a in adds if not a.get("deletionVector")]
    size = sum(a["size"] for a in written) / 2**20
    return f"{len(written)} files written ({size:,.1f} MiB), {marked} marked with a vector"


if __name__ == "__main__":
    main()
