"""What keeping ``history/<table>`` costs: the history merge beside the state merge it follows.

A history (every version of each row) is merged after the state, from the same window, without
a JVM: new versions appended, the versions they end updated in place by one delta-rs MERGE,
which rewrites every file holding a version it ends. Both merges here are the JVM-free ones
(``arrow_merge.merge_small`` for the state, ``merge_history`` for the history), every batch
within what the state's path takes (keyed tables, no TRUNCATE, no key change), so no Spark is
started and the figures are the two merges alone. Windows are written through the lake's window
API, as the drain writes them.

- **40 tables**: ``--tables`` keyed tables (``id bigint`` key, ``qty int``, ``label text``), a
  first window inserting ``--rows`` rows in each, then ``--rounds`` windows of ``--changes``
  changes per table at random keys: 70% updates (a third of them leaving ``label`` an unchanged
  TOAST value, whose history version takes it from the version it ends), 15% deletes, 15%
  inserts of new keys. Each round times the state merge of every table, then the history merge
  of every table; the medians of the rounds, their ratio, and the history's size after them.
  The many-small-tables drain: what history adds to a merge of milliseconds per table.
- **benchmark workload**: the benchmark workload (1,000,000 inserts then 250,000 updates of a
  4-column table in transactions of 10,000 rows) scaled by ``--scale``, in windows of
  ``--window`` changes: the state and history merge of each window (the first creates the
  history, later windows of inserts append to it, windows of updates MERGE and end versions),
  and the peak resident memory of a process that merges the states alone against one that
  merges the histories too (two child processes, so each peak is its own).

Not a test: ``python -m bench.bench_history``; results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.merge.history import merge_history
from airflow_pglogrepl.tables import TableRef

APP = "bench"
START = 0x1000  # the first window's start
STEP = 0x10  # LSNs between two transactions' commits
SMALL_COLUMNS = [
    pa.field("id", pa.int64()),
    pa.field("qty", pa.int32()),
    pa.field("label", pa.string()),
]
WORKLOAD_COLUMNS = [*SMALL_COLUMNS, pa.field("at", pa.timestamp("us", tz="UTC"))]
WORKLOAD_TABLE = TableRef("public", "bench")
FULL_INSERTS, FULL_UPDATES, TRANSACTION_ROWS = 1_000_000, 250_000, 10_000
EPOCH = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)

Transaction = list[dict[str, Any]]  # one transaction's changes of one table, in order


def changelog_schema(columns: list[pa.Field]) -> pa.Schema:
    """A changelog of a table of ``columns`` keyed by ``id`` (replica identity default)."""
    return pa.schema([*cl.mark_keys(columns, ["id"]), *cl.meta_fields(columns, "d")])


def commit_window(lake: Lake, start: LSN, transactions: list[tuple[TableRef, Transaction]],
                  schemas: dict[TableRef, pa.Schema]) -> LSN:  # fmt: skip
    """One committed window from ``start`` of ``transactions`` (each one table's changes), in
    order, each given its commit LSN and its changes their ``_seq``; returns the window's end."""
    rows: dict[TableRef, list[dict[str, Any]]] = {}
    for number, (table, changes) in enumerate(transactions, start=1):
        lsn = int(start) + STEP * number
        at = EPOCH + dt.timedelta(microseconds=lsn)
        for seq, change in enumerate(changes):
            rows.setdefault(table, []).append(
                {
                    cl.UNCHANGED: [],
                    cl.OLD: None,
                    **change,
                    cl.COMMIT_LSN: lsn,
                    cl.SEQ: seq,
                    cl.XID: lsn,
                    cl.COMMIT_TS: at,
                }
            )
    end = LSN(int(start) + STEP * (len(transactions) + 1))
    window = Window(lake, start)
    for table, batch in rows.items():
        window.write(table, pa.Table.from_pylist(batch, schema=schemas[table]))
    count = sum(len(changes) for _, changes in transactions)
    window.commit(end, transactions=len(transactions), changes=count)
    return end


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``run`` took, and what it returned."""
    began = time.perf_counter()
    result = run()
    return time.perf_counter() - began, result


def merge_states(lake: Lake, names: list[str]) -> float:
    """Seconds of the JVM-free state merge of ``names``; every one must be merged there."""
    seconds, (merged, declined) = timed(lambda: arrow_merge.merge_small(lake, names))
    assert not declined and len(merged) == len(names), (merged, declined)
    return seconds


def merge_histories(lake: Lake, names: list[str]) -> float:
    """Seconds of the history merge of ``names``; every one must be brought up to date."""
    seconds, done = timed(lambda: merge_history(lake, names))
    assert len(done) == len(names), done
    return seconds


def sizes(lake: Lake, kind: str, names: list[str]) -> dict[str, int]:
    """The live data files of ``kind`` (``state`` or ``history``) tables of ``names`` and their
    bytes, and the bytes of every data file on disk (files no longer live included)."""
    files = live = disk = 0
    for name in names:
        uri = lake.paths.state(name) if kind == "state" else lake.paths.history(name)
        found = delta.file_sizes(delta.open_table(uri))
        files, live = files + len(found), live + sum(found)
        disk += sum(p.stat().st_size for p in Path(uri).glob("*.parquet"))
    return {"files": files, "bytes": live, "disk_bytes": disk}


def last_commit(lake: Lake, name: str) -> dict[str, Any]:
    """The history's newest commit: its operation, and for a MERGE the files it rewrote and the
    rows it copied into them unchanged (copy-on-write)."""
    history = delta.open_table(lake.paths.history(name))
    assert history is not None, name
    entry = history.history(limit=1)[0]
    metrics = entry.get("operationMetrics") or {}
    return {
        "operation": entry.get("operation"),
        "files_rewritten": metrics.get("num_target_files_removed"),
        "rows_copied": metrics.get("num_target_rows_copied"),
    }


# 40 tables


def first_rows(rows: int) -> Transaction:
    """A table's first window: ``rows`` inserts."""
    return [{"id": key, "qty": key % 1000, "label": f"label {key}", cl.OP: "I"}
            for key in range(1, rows + 1)]  # fmt: skip


def round_changes(rng: random.Random, live: set[int], next_key: int, count: int,
                  round_no: int) -> tuple[list[Transaction], int]:  # fmt: skip
    """``count`` changes of one table at distinct random keys, one transaction each: 70%
    updates (a third leaving ``label`` unchanged TOAST), 15% deletes, 15% inserts of new keys;
    ``live`` is brought up to date. Returns them and the next new key."""
    updates, deletes = round(count * 0.70), round(count * 0.15)
    touched = rng.sample(sorted(live), updates + deletes)
    changes: list[dict[str, Any]] = []
    for n, key in enumerate(touched[:updates]):
        if n % 3 == 0:
            changes.append({"id": key, "qty": rng.randrange(1000), "label": None, cl.OP: "U",
                            cl.UNCHANGED: ["label"]})  # fmt: skip
        else:
            changes.append({"id": key, "qty": rng.randrange(1000),
                            "label": f"label {key} r{round_no}", cl.OP: "U"})  # fmt: skip
    for key in touched[updates:]:
        changes.append({"id": key, cl.OP: "D"})
        live.discard(key)
    for key in range(next_key, next_key + count - updates - deletes):
        changes.append({"id": key, "qty": key % 1000, "label": f"label {key}", cl.OP: "I"})
        live.add(key)
    rng.shuffle(changes)
    return [[change] for change in changes], next_key + count - updates - deletes


def many_tables(root: Path, tables: int, rows: int, changes: int, rounds: int,
                seed: int) -> dict[str, Any]:  # fmt: skip
    """The 40-tables case of the module docstring; its figures."""
    lake = Lake(str(root), APP)
    refs = [TableRef("public", f"t{i:02d}") for i in range(tables)]
    names = [table_dir(t) for t in refs]
    schemas = dict.fromkeys(refs, changelog_schema(SMALL_COLUMNS))
    rng = random.Random(seed)
    end = commit_window(lake, LSN(START), [(t, first_rows(rows)) for t in refs], schemas)
    first = {"state_s": merge_states(lake, names), "history_s": merge_histories(lake, names)}
    live = {t: set(range(1, rows + 1)) for t in refs}
    next_key = dict.fromkeys(refs, rows + 1)
    measured: list[dict[str, Any]] = []
    for round_no in range(1, rounds + 1):
        transactions: list[tuple[TableRef, Transaction]] = []
        for table in refs:
            made, next_key[table] = round_changes(rng, live[table], next_key[table], changes,
                                                  round_no)  # fmt: skip
            transactions += [(table, t) for t in made]
        rng.shuffle(transactions)  # the tables' transactions interleaved, as in the WAL
        end = commit_window(lake, end, transactions, schemas)
        state = merge_states(lake, names)
        history = merge_histories(lake, names)
        commits = [last_commit(lake, name) for name in names]
        measured.append({"state_s": state, "history_s": history,
                         "files_rewritten": sum(c["files_rewritten"] or 0 for c in commits),
                         "rows_copied": sum(c["rows_copied"] or 0 for c in commits)})  # fmt: skip
    state = statistics.median(m["state_s"] for m in measured)
    history = statistics.median(m["history_s"] for m in measured)
    return {
        "tables": tables, "rows": rows, "changes": changes, "rounds": rounds, "first": first,
        "rounds_measured": measured, "state_s": state, "history_s": history,
        "files_rewritten": statistics.median(m["files_rewritten"] for m in measured),
        "rows_copied": statistics.median(m["rows_copied"] for m in measured),
        "ratio": history / state, "history": sizes(lake, "history", names),
        "state": sizes(lake, "state", names),
    }  # fmt: skip


# benchmark workload


def workload_transactions(inserts: int, updates: int) -> Iterator[Transaction]:
    """The benchmark workload's transactions: ``inserts`` rows, then ``updates`` updates of
    ``qty`` and ``label`` by ascending key, ``TRANSACTION_ROWS`` rows a transaction."""

    def insert(key: int) -> dict[str, Any]:
        return {"id": key, "qty": key % 1000, "label": f"row {key}", cl.OP: "I",
                "at": EPOCH + dt.timedelta(seconds=key)}  # fmt: skip

    def update(n: int) -> dict[str, Any]:
        key, times = n % inserts + 1, n // inserts + 1
        return {"id": key, "qty": key % 1000 + times, "label": f"row {key}" + "!" * times,
                cl.OP: "U", "at": EPOCH + dt.timedelta(seconds=key)}  # fmt: skip

    for first in range(0, inserts, TRANSACTION_ROWS):
        yield [insert(k) for k in range(first + 1, min(first + TRANSACTION_ROWS, inserts) + 1)]
    for first in range(0, updates, TRANSACTION_ROWS):
        yield [update(n) for n in range(first, min(first + TRANSACTION_ROWS, updates))]


def workload_windows(inserts: int, updates: int, window: int) -> Iterator[list[Transaction]]:
    """The workload's transactions grouped into windows of about ``window`` changes."""
    held: list[Transaction] = []
    count = 0
    for transaction in workload_transactions(inserts, updates):
        held.append(transaction)
        count += len(transaction)
        if count >= window:
            yield held
            held, count = [], 0
    if held:
        yield held


def workload_child(root: Path, inserts: int, updates: int, window: int,
                   history: bool) -> dict[str, Any]:  # fmt: skip
    """The workload merged window by window, its state alone or its history too, in this
    process: each window's figures and this process's peak resident memory."""
    lake = Lake(str(root), APP)
    name = table_dir(WORKLOAD_TABLE)
    schemas = {WORKLOAD_TABLE: changelog_schema(WORKLOAD_COLUMNS)}
    end = LSN(START)
    windows: list[dict[str, Any]] = []
    for transactions in workload_windows(inserts, updates, window):
        end = commit_window(lake, end, [(WORKLOAD_TABLE, t) for t in transactions], schemas)
        ops = {change[cl.OP] for t in transactions for change in t}
        figures: dict[str, Any] = {
            "changes": sum(map(len, transactions)),
            "kind": {frozenset("I"): "inserts", frozenset("U"): "updates"}.get(
                frozenset(ops), "inserts, updates"
            ),
            "state_s": merge_states(lake, [name]),
        }
        if history:
            figures["history_s"] = merge_histories(lake, [name])
            figures.update(last_commit(lake, name))
        windows.append(figures)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    found = sizes(lake, "history", [name]) if history else None
    return {"windows": windows, "peak_rss_mib": round(peak, 1), "history": found}


def run_child(root: Path, inserts: int, updates: int, window: int, history: bool) -> Any:
    """``workload_child`` in a child process of its own (its peak memory its own)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_history", "--child", str(root),
         "--child-inserts", str(inserts), "--child-updates", str(updates),
         "--window", str(window), *(["--child-history"] if history else [])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def workload(work: Path, scale: float, window: int) -> dict[str, Any]:
    """The benchmark-workload case of the module docstring; its figures."""
    inserts, updates = round(FULL_INSERTS * scale), round(FULL_UPDATES * scale)
    alone = run_child(work / "state-alone", inserts, updates, window, history=False)
    both = run_child(work / "with-history", inserts, updates, window, history=True)
    return {"inserts": inserts, "updates": updates, "window": window, "state_alone": alone,
            "with_history": both}  # fmt: skip


# report


def mib(size: int) -> str:
    return f"{size / 2**20:,.2f} MiB"


def ratio(history: float, state: float) -> str:
    return f"{history / state:.1f}x" if state > 0 else "-"


def print_table(results: dict[str, Any]) -> None:
    """The figures as plain text."""
    many = results["many_tables"]
    print(f"\n1. {many['tables']} tables of {many['rows']:,} rows, then {many['rounds']} "
          f"rounds of {many['changes']} changes per table (all merged, no JVM)\n")  # fmt: skip
    print(f"{'':<26} {'state s':>9} {'history s':>10} {'history/state':>14}")
    first = many["first"]
    print(f"{'first window (creation)':<26} {first['state_s']:>9.2f} {first['history_s']:>10.2f} "
          f"{ratio(first['history_s'], first['state_s']):>14}")  # fmt: skip
    print(f"{'round (median)':<26} {many['state_s']:>9.2f} {many['history_s']:>10.2f} "
          f"{ratio(many['history_s'], many['state_s']):>14}")  # fmt: skip
    print(f"history MERGEs of a round (median): {many['files_rewritten']:,.0f} files rewritten, "
          f"{many['rows_copied']:,.0f} rows copied unchanged into them")  # fmt: skip
    for kind in ("history", "state"):
        found = many[kind]
        print(f"{kind} after the rounds: {found['files']} live files, {mib(found['bytes'])} "
              f"({mib(found['disk_bytes'])} on disk)")  # fmt: skip
    load = results["workload"]
    both, alone = load["with_history"], load["state_alone"]
    print(f"\n2. benchmark workload x{results['scale']}: {load['inserts']:,} inserts then "
          f"{load['updates']:,} updates of one table, windows of {load['window']:,} "
          f"changes\n")  # fmt: skip
    print(f"{'window':>6} {'changes':>8} {'kind':<17} {'state s':>8} {'history s':>10} "
          f"{'history/state':>14}  {'history commit':<14} {'files rewritten':>16} "
          f"{'rows copied':>12}")  # fmt: skip
    for number, figures in enumerate(both["windows"], start=1):
        rewritten, copied = figures.get("files_rewritten"), figures.get("rows_copied")
        print(f"{number:>6} {figures['changes']:>8,} {figures['kind']:<17} "
              f"{figures['state_s']:>8.2f} {figures['history_s']:>10.2f} "
              f"{ratio(figures['history_s'], figures['state_s']):>14}  "
              f"{figures['operation'] or '-':<14} {'-' if rewritten is None else rewritten:>16} "
              f"{'-' if copied is None else f'{copied:,}':>12}")  # fmt: skip
    found = both["history"]
    print(f"history after the workload: {found['files']} live files, {mib(found['bytes'])} "
          f"({mib(found['disk_bytes'])} on disk)")  # fmt: skip
    increase = both["peak_rss_mib"] - alone["peak_rss_mib"]
    print(f"peak RSS: state alone {alone['peak_rss_mib']:,.0f} MiB, with history "
          f"{both['peak_rss_mib']:,.0f} MiB ({increase:+,.0f} MiB)")  # fmt: skip
    print(f"\nload average {results['load']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--rows", type=int, default=2_000, help="rows of each table at first")
    parser.add_argument("--changes", type=int, default=50, help="changes per table a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=0.2,
                        help="of the benchmark workload (1,000,000 inserts, 250,000 "
                             "updates)")  # fmt: skip
    parser.add_argument("--window", type=int, default=50_000, help="changes a window")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-inserts", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-updates", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-history", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(workload_child(args.child, args.child_inserts, args.child_updates,
                                        args.window, args.child_history)))  # fmt: skip
        return
    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        many = many_tables(work / "many", args.tables, args.rows, args.changes, args.rounds,
                           args.seed)  # fmt: skip
        print(f"{args.tables} tables done", file=sys.stderr, flush=True)
        load = workload(work, args.scale, args.window)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {"many_tables": many, "workload": load, "scale": args.scale,
               "load": ", ".join(f"{x:.1f}" for x in os.getloadavg())}  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
