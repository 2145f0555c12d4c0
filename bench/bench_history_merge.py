"""What a big history's MERGE and a long catch-up cost: delta-rs against Spark, steps against one.

A history (``merge.history``) ends the versions a batch replaces by one MERGE. delta-rs' MERGE
is copy-on-write: every file holding a version it ends is written again whole, and the versions
a batch ends lie all over a big history, so past ``history_spark.SPARK_BYTES`` of files the
MERGE runs on Spark, which marks them in deletion vectors instead. And a history turned on over
a long changelog would hold all of it at once, so it catches up in steps of about
``history_steps.BATCH_BYTES`` of Arrow, each its own commit. Both are measured here, on
changelog windows committed through the lake's window API (as the drain writes them), no
PostgreSQL; the payload is random text, which Snappy leaves as it is, so Arrow and file sizes
agree.

- **A. ending versions in a big history**: a keyed table (``id bigint`` key, ``v bigint``,
  ``payload text`` of ``--payload`` bytes) whose history is built by ``--files`` runs of
  inserts (one file each, ``--history-mb`` MiB of files in all), then one window of
  ``--updates`` updates at keys drawn uniformly from the whole range. That run's history merge
  is timed on delta-rs (``SPARK_BYTES`` out of reach) and on Spark (``SPARK_BYTES=0``), each on
  its own copy of the lake. The Spark session is started, and one tiny MERGE run, before
  (both timed apart). Bytes are read from the run's commit: files added (new paths; a file
  that gets a deletion vector is removed and added again under its own path, and is counted as
  marked), deletion-vector files written, files removed. The two histories are compared.
- **B. catch-up memory**: a changelog of ``--catchup-mb`` MiB of Arrow (inserts of a fifth of
  the rows' keys, then updates of them in turn) whose history is turned on at its end (no
  state: it begins with the changelog). A child process merges it in steps of
  ``--step-mb`` (default ``BATCH_BYTES``), another in one batch (``BATCH_BYTES`` past the
  whole range): the peak RSS of each, its commits and seconds. No JVM (the steps' MERGEs run on
  delta-rs). The two histories are compared. The peak is the child's ``VmHWM``, not its
  ``ru_maxrss``: Linux carries a process's ``ru_maxrss`` across ``exec``, so a child started by
  a parent that once held more reports the parent's peak (this one builds the lakes first).

Not a test: ``python -m bench.bench_history_merge`` (``PGLOGREPL_DELTA_JARS`` for Spark's jars).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.changelog.history_columns import (
    IS_CURRENT,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO_LSN,
)
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import history_spark, history_steps
from airflow_pglogrepl.merge.history import merge_history
from airflow_pglogrepl.merge.history_changes import TableChanges
from airflow_pglogrepl.merge.history_steps import steps
from airflow_pglogrepl.tables import TableRef

APP = "bench"
TABLE = TableRef("public", "bench")
NAME = table_dir(TABLE)
COLUMNS = [pa.field("id", pa.int64()), pa.field("v", pa.int64()), pa.field("payload", pa.string())]
SCHEMA = pa.schema([*cl.mark_keys(COLUMNS, ["id"]), *cl.meta_fields(COLUMNS, "d")])
START = 0x1000  # the first window's start
STEP = 0x10  # LSNs between two transactions' commits
TRANSACTION_ROWS = 1_000
WINDOW_BYTES = 64 << 20  # Arrow bytes of a catch-up window, about
EPOCH_US = int(dt.datetime(2026, 6, 1, tzinfo=dt.UTC).timestamp() * 1_000_000)
ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                         dtype=np.uint8)  # fmt: skip
COMPARED = ["id", "v", VALID_FROM_LSN, VALID_FROM_SEQ, VALID_TO_LSN, IS_CURRENT]
NO_STRINGS = pa.array([], pa.string())
SPARK_TIMES = ("executionTimeMs", "materializeSourceTimeMs", "scanTimeMs", "rewriteTimeMs")
NEVER = 1 << 62  # a limit no history or changelog here reaches


# changelog windows


def payloads(rng: np.random.Generator, count: int, size: int) -> Any:
    """``count`` strings of ``size`` random characters (6 bits each: Snappy cannot shrink them)."""
    if count * size >= 1 << 31:
        raise SystemExit("a window's payloads pass 2 GiB: use more --files or a smaller --payload")
    data = ALPHABET[rng.integers(0, len(ALPHABET), count * size, dtype=np.uint8)]
    offsets = np.arange(0, (count + 1) * size, size, dtype=np.int32)
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))


def changes(rng: np.random.Generator, ids: np.ndarray[Any, Any], op: str, start: int,
            version: int, size: int) -> tuple[Any, int]:  # fmt: skip
    """Changes ``op`` of the keys ``ids`` (``v`` set to ``version``) in transactions of
    ``TRANSACTION_ROWS``, committed after ``start``; the rows and the transactions."""
    count = len(ids)
    number = np.arange(count, dtype=np.int64)
    lsn = start + STEP * (number // TRANSACTION_ROWS + 1)
    arrays = [
        pa.array(ids, pa.int64()),
        pa.array(np.full(count, version, dtype=np.int64)),
        payloads(rng, count, size),
        pa.repeat(op, count),
        pa.array(lsn),
        pa.array(number % TRANSACTION_ROWS),
        pa.array(lsn),
        pa.array(lsn + EPOCH_US).cast(SCHEMA.field(cl.COMMIT_TS).type),
        pa.ListArray.from_arrays(pa.array(np.zeros(count + 1, dtype=np.int32)), NO_STRINGS),
        pa.nulls(count, SCHEMA.field(cl.OLD).type),
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA), -(-count // TRANSACTION_ROWS)


def commit(lake: Lake, start: LSN, rows: Any, transactions: int) -> LSN:
    """One committed window from ``start`` holding ``rows``; its end."""
    end = LSN(int(start) + STEP * (transactions + 1))
    window = Window(lake, start)
    window.write(TABLE, rows)
    window.commit(end, transactions=transactions, changes=rows.num_rows)
    return end


def history_uri(root: Path) -> str:
    return Lake(str(root), APP).paths.history(NAME)


def compared(root: Path) -> Any:
    """The history's versions in an order of their own (narrow columns: payloads left out)."""
    rows = delta.scan(history_uri(root), columns=COMPARED)
    return rows.sort_by([(c, "ascending") for c in ("id", VALID_FROM_LSN, VALID_FROM_SEQ)])


def seconds(began: float) -> float:
    return round(time.perf_counter() - began, 2)


# A. ending versions in a big history


def big_history(root: Path, rng: np.random.Generator, history_bytes: int, files: int,
                size: int, updates: int) -> dict[str, Any]:  # fmt: skip
    """The lake of case A: ``files`` runs of inserts merged into the history one by one, the
    rows of the first telling how many the rest need for ``history_bytes`` of files; then one
    window of ``updates`` updates at uniformly drawn keys, not merged yet."""
    lake = Lake(str(root), APP)
    uri = lake.paths.history(NAME)
    end, keys, rows = LSN(START), 0, max(1, history_bytes // files // (size + 48))
    for number in range(files):
        ids = np.arange(keys, keys + rows, dtype=np.int64)
        batch, transactions = changes(rng, ids, "I", int(end), 0, size)
        end = commit(lake, end, batch, transactions)
        merge_history(lake, [NAME])
        keys += rows
        if number == 0:  # the bytes of a history row, as written
            per_row = sum(delta.file_sizes(delta.open_table(uri))) / rows
            rows = max(1, round((history_bytes / per_row - keys) / max(1, files - 1)))
    found = delta.file_sizes(delta.open_table(uri))
    picked = np.sort(rng.choice(keys, size=min(updates, keys), replace=False)).astype(np.int64)
    batch, transactions = changes(rng, picked, "U", int(end), 1, size)
    commit(lake, end, batch, transactions)
    return {"rows": keys, "files": len(found), "bytes": sum(found), "updates": len(picked)}


def start_spark() -> tuple[Any, float, float]:
    """A local Spark session with Delta, and one tiny MERGE (classes loaded, code generated):
    the session, the seconds of each."""
    from delta.tables import DeltaTable

    from airflow_pglogrepl.spark.session import local_session

    began = time.perf_counter()
    spark = local_session("bench-history-merge")
    spark.range(1).count()
    started = seconds(began)
    began = time.perf_counter()
    where = tempfile.mkdtemp(prefix="bench-warm-")
    try:
        spark.range(100).write.format("delta").save(where)
        source = spark.range(50, 150).alias("s")
        DeltaTable.forPath(spark, where).alias("t").merge(source, "t.id = s.id") \
            .whenMatchedUpdate(set={"id": "s.id"}).whenNotMatchedInsertAll().execute()  # fmt: skip
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return spark, started, seconds(began)


def table_files(uri: str) -> dict[str, int]:
    """Every file of the table directory outside its log, by relative path, and its bytes."""
    base = Path(uri)
    return {str(p.relative_to(base)): p.stat().st_size for p in base.rglob("*")
            if p.is_file() and "_delta_log" not in p.parts}  # fmt: skip


def commit_bytes(uri: str, before: int, files_before: dict[str, int]) -> dict[str, Any]:
    """What the commits after version ``before`` wrote and removed: their add and remove
    actions (an add and a remove of one path: a file given a deletion vector, not written), and
    the deletion-vector files that appeared."""
    added: dict[str, int] = {}
    removed: dict[str, int] = {}
    operations = []
    metrics: dict[str, Any] = {}
    table = delta.open_table(uri)
    assert table is not None, uri
    for version in range(before + 1, int(table.version()) + 1):
        text = Path(uri, "_delta_log", f"{version:020d}.json").read_text()
        for line in text.splitlines():
            action = json.loads(line)
            if "add" in action:
                added[action["add"]["path"]] = int(action["add"].get("size") or 0)
            elif "remove" in action:
                removed[action["remove"]["path"]] = int(action["remove"].get("size") or 0)
            elif "commitInfo" in action:
                operations.append(action["commitInfo"].get("operation"))
                metrics = action["commitInfo"].get("operationMetrics") or {}
    marked = added.keys() & removed.keys()
    vectors = [size for path, size in table_files(uri).items()
               if path not in files_before and not path.endswith(".parquet")]  # fmt: skip
    return {
        "operations": operations,
        "files_written": len(added) - len(marked),
        "bytes_written": sum(s for p, s in added.items() if p not in marked) + sum(vectors),
        "vector_files": len(vectors),
        "vector_bytes": sum(vectors),
        "files_marked": len(marked),
        "files_removed": len(removed) - len(marked),
        "bytes_removed": sum(s for p, s in removed.items() if p not in marked),
        "merge_ms": {k: int(metrics[k]) for k in SPARK_TIMES if k in metrics},
    }


def timed_merge(root: Path, spark: Any, limit: int) -> dict[str, Any]:
    """The pending run's history merge with ``SPARK_BYTES`` at ``limit``: its seconds and
    commit bytes."""
    lake = Lake(str(root), APP)
    uri = lake.paths.history(NAME)
    table = delta.open_table(uri)
    assert table is not None, uri
    before, files = int(table.version()), table_files(uri)
    saved, history_spark.SPARK_BYTES = history_spark.SPARK_BYTES, limit
    try:
        began = time.perf_counter()
        done = merge_history(lake, [NAME], spark=lambda: spark)
        took = seconds(began)
    finally:
        history_spark.SPARK_BYTES = saved
    assert done == {NAME: str(lake.position())}, done
    return {"seconds": took, **commit_bytes(uri, before, files)}


def ending_versions(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Case A of the module docstring; its figures."""
    rng = np.random.default_rng(args.seed)
    began = time.perf_counter()
    built = big_history(work / "built", rng, args.history_mb << 20, args.files, args.payload,
                        args.updates)  # fmt: skip
    built["build_s"] = seconds(began)
    print(f"A: history of {built['rows']:,} rows built in {built['build_s']} s",
          file=sys.stderr, flush=True)  # fmt: skip
    spark, started, warm = start_spark()
    try:
        runs = {}
        for engine, limit in (("delta-rs", NEVER), ("Spark", 0)):
            copy = work / engine
            shutil.copytree(work / "built", copy)
            runs[engine] = timed_merge(copy, spark, limit)
            print(f"A: {engine} {runs[engine]['seconds']} s", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    same = compared(work / "delta-rs").equals(compared(work / "Spark"))
    shutil.rmtree(work / "built", ignore_errors=True)
    return {**built, "spark_start_s": started, "spark_warm_merge_s": warm, "runs": runs,
            "same_history": same}  # fmt: skip


# B. catch-up memory


def long_changelog(root: Path, rng: np.random.Generator, total_bytes: int,
                   size: int) -> dict[str, Any]:  # fmt: skip
    """The lake of case B: about ``total_bytes`` of Arrow changes in windows of about
    ``WINDOW_BYTES``: inserts of a fifth of the changes' keys, then updates of them in turn."""
    lake = Lake(str(root), APP)
    sample, _ = changes(rng, np.arange(TRANSACTION_ROWS, dtype=np.int64), "U", START, 0, size)
    per_change = sample.nbytes / sample.num_rows
    total = max(2 * TRANSACTION_ROWS, round(total_bytes / per_change))
    keys = max(TRANSACTION_ROWS, total // 5)
    per_window = max(TRANSACTION_ROWS, round(WINDOW_BYTES / per_change))
    end, made, windows = LSN(START), 0, 0
    while made < total:
        count = min(per_window, total - made)
        if made < keys:
            ids, op = np.arange(made, min(keys, made + count), dtype=np.int64), "I"
        else:
            ids, op = (np.arange(made, made + count, dtype=np.int64) - keys) % keys, "U"
        batch, transactions = changes(rng, ids, op, int(end), made // keys, size)
        end = commit(lake, end, batch, transactions)
        made, windows = made + len(ids), windows + 1
    table = TableChanges(delta.open_table(lake.paths.changes(NAME)))
    return {"changes": made, "keys": keys, "windows": windows,
            "arrow_bytes": table.size_bytes(None, int(end))}  # fmt: skip


def peak_rss_mib() -> float:
    """This process's peak resident memory: ``VmHWM`` (its own, unlike ``ru_maxrss``: see the
    module docstring), ``ru_maxrss`` where there is no ``/proc``."""
    try:
        with open("/proc/self/status") as status:
            found = [line.split()[1] for line in status if line.startswith("VmHWM:")]
        return int(found[0]) / 1024  # kB
    except (OSError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def catchup_child(root: Path, batch_bytes: int) -> dict[str, Any]:
    """The history of the lake at ``root`` merged from nothing, in steps of ``batch_bytes``, in
    this process: its seconds, commits, and this process's peak resident memory before the
    merge and after it."""
    lake = Lake(str(root), APP)
    end = lake.position()
    assert end is not None
    table = TableChanges(delta.open_table(lake.paths.changes(NAME)))
    planned = len(steps(table, None, int(end), batch_bytes))
    baseline = peak_rss_mib()
    history_steps.BATCH_BYTES = batch_bytes
    began = time.perf_counter()
    done = merge_history(lake, [NAME])
    took = seconds(began)
    peak = peak_rss_mib()
    assert done == {NAME: str(end)}, done
    history = delta.open_table(lake.paths.history(NAME))
    assert history is not None
    return {"seconds": took, "steps": planned, "commits": int(history.version()) + 1,
            "baseline_rss_mib": round(baseline), "peak_rss_mib": round(peak),
            "history_bytes": sum(delta.file_sizes(history))}  # fmt: skip


def run_child(root: Path, batch_bytes: int) -> Any:
    """``catchup_child`` in a child process of its own (its peak memory its own)."""
    here = Path(__file__).resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(here.parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(here), "--child", str(root), "--child-batch-bytes", str(batch_bytes)],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def catch_up(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Case B of the module docstring; its figures."""
    rng = np.random.default_rng(args.seed + 1)
    root = work / "catchup"
    began = time.perf_counter()
    built = long_changelog(root, rng, args.catchup_mb << 20, args.payload)
    built["build_s"] = seconds(began)
    print(f"B: changelog of {built['changes']:,} changes built in {built['build_s']} s",
          file=sys.stderr, flush=True)  # fmt: skip
    step = history_steps.BATCH_BYTES if args.step_mb is None else args.step_mb << 20
    runs, histories = {}, {}
    for label, limit in (("steps", step), ("one batch", NEVER)):
        shutil.rmtree(history_uri(root), ignore_errors=True)  # (the changelog is left as it is)
        runs[label] = run_child(root, limit)
        histories[label] = compared(root)
        print(f"B: {label} {runs[label]['seconds']} s", file=sys.stderr, flush=True)
    same = histories["steps"].equals(histories["one batch"])
    current = histories["steps"].filter(histories["steps"].column(IS_CURRENT)).num_rows
    expected = histories["steps"].num_rows == built["changes"] and current == built["keys"]
    return {**built, "step_bytes": step, "runs": runs, "same_history": same,
            "expected_counts": expected}  # fmt: skip


# report


def mib(size: float) -> str:
    return f"{size / 2**20:,.1f}"


def print_table(results: dict[str, Any]) -> None:
    """The figures as plain text."""
    if "ending_versions" in results:
        print_ending(results["ending_versions"], results["payload"])
    if "catch_up" in results:
        print_catch_up(results["catch_up"])
    print(f"\nload average {results['load']}; {results['seconds']} s in all")


def print_ending(a: dict[str, Any], payload: int) -> None:
    print(f"\nA. {a['updates']:,} updates at uniform keys into a history of {a['rows']:,} rows, "
          f"{a['files']} files, {mib(a['bytes'])} MiB (payload {payload} B)")  # fmt: skip
    print(f"   Spark session start {a['spark_start_s']} s, a first tiny MERGE "
          f"{a['spark_warm_merge_s']} s (both before, not in the figures)\n")  # fmt: skip
    print(f"{'engine':<9} {'seconds':>8} {'files written':>14} {'MiB written':>12} "
          f"{'DV files':>9} {'DV KiB':>8} {'files marked':>13} {'files removed':>14} "
          f"{'MiB removed':>12}")  # fmt: skip
    for engine, run in a["runs"].items():
        print(f"{engine:<9} {run['seconds']:>8.2f} {run['files_written']:>14} "
              f"{mib(run['bytes_written']):>12} {run['vector_files']:>9} "
              f"{run['vector_bytes'] / 1024:>8.1f} {run['files_marked']:>13} "
              f"{run['files_removed']:>14} {mib(run['bytes_removed']):>12}")  # fmt: skip
    rs, sp = a["runs"]["delta-rs"], a["runs"]["Spark"]
    times = ", ".join(f"{k.removesuffix('TimeMs')} {v / 1000:.1f} s"
                      for k, v in sp["merge_ms"].items())  # fmt: skip
    print(f"Spark's MERGE by its own metrics: {times}")
    print(f"delta-rs/Spark: {rs['seconds'] / sp['seconds']:.2f}x the seconds, "
          f"{rs['bytes_written'] / max(1, sp['bytes_written']):.1f}x the bytes written; "
          f"same history: {a['same_history']}")  # fmt: skip


def print_catch_up(b: dict[str, Any]) -> None:
    print(f"\nB. history turned on over {b['changes']:,} changes ({b['keys']:,} keys, "
          f"{b['windows']} windows), {mib(b['arrow_bytes'])} MiB of Arrow; steps of "
          f"{mib(b['step_bytes'])} MiB, no JVM\n")  # fmt: skip
    print(f"{'merged in':<10} {'steps':>6} {'commits':>8} {'seconds':>8} {'baseline RSS MiB':>17} "
          f"{'peak RSS MiB':>13} {'history MiB':>12}")  # fmt: skip
    for label, run in b["runs"].items():
        print(f"{label:<10} {run['steps']:>6} {run['commits']:>8} {run['seconds']:>8.2f} "
              f"{run['baseline_rss_mib']:>17,} {run['peak_rss_mib']:>13,} "
              f"{mib(run['history_bytes']):>12}")  # fmt: skip
    print(f"same history: {b['same_history']}; versions and current ones as the changes make "
          f"them: {b['expected_counts']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history-mb", type=int, default=400, help="A: the history's files")
    parser.add_argument("--files", type=int, default=12, help="A: runs of inserts (files)")
    parser.add_argument("--updates", type=int, default=20_000, help="A: keys the run updates")
    parser.add_argument("--catchup-mb", type=int, default=600, help="B: Arrow of the changelog")
    parser.add_argument("--step-mb", type=int, help="B: a step's Arrow (default BATCH_BYTES)")
    parser.add_argument("--payload", type=int, default=512, help="bytes of a row's payload")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", choices=["A", "B"], help="one case alone")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-batch-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(catchup_child(args.child, args.child_batch_bytes)))
        return
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-history-merge-"))
    results: dict[str, Any] = {"payload": args.payload}
    try:
        if args.only != "B":
            results["ending_versions"] = ending_versions(work, args)
        if args.only != "A":
            results["catch_up"] = catch_up(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    results["seconds"] = seconds(began)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
