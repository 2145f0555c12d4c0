"""Materialize ``state/<schema>.<table>/`` from the committed changelog, crash-safely.

Each table's state carries the LSN it includes (``_pglogrepl/state/<table>.json``). A run merges
the windows committed after that LSN onto the previous state with ``merge_state`` (Spark), in
three steps like the changelog's: Spark writes the new state under ``_pglogrepl/state_next/``;
the state record pointing at it is written atomically (the commit point); the directory is
swapped into ``state/``. A crash before the record leaves the old state in force (the next run
merges again); after it, the next run finishes the swap. Tables are merged in parallel: Spark
runs jobs from several driver threads side by side.

A state record's LSN is an exclusive bound: the state includes every change whose transaction
commits before it (``_commit_lsn`` < LSN), and only those. A window end and an initial snapshot's
consistent point both mean exactly that. A table re-snapshotted alone (``install_state``) gets
the consistent point of its own snapshot, which may fall inside a committed window: merging then
takes only the changes at or after it, and a state record is never moved back.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.sink import META, CommitRecord, Sink, window_id

log = logging.getLogger("airflow_pglogrepl.drain")


def _record_path(sink: Sink, table: str) -> str:
    return sink.state_record_path(table)


def _read_record(sink: Sink, table: str) -> dict[str, Any] | None:
    path = _record_path(sink, table)
    if not sink.storage.exists(path):
        return None
    record: dict[str, Any] = json.loads(sink.storage.read_text(path))
    return record


def _finish_swap(sink: Sink, table: str, record: dict[str, Any]) -> None:
    pending = record.get("next")
    if pending and sink.storage.exists(pending):
        sink.storage.delete(sink.state_dir(table))
        sink.storage.move(pending, sink.state_dir(table))
    if pending:
        sink.storage.write_text_atomic(
            _record_path(sink, table), json.dumps({**record, "next": None})
        )


def materialize(spark: Any, sink: Sink, *, parallelism: int = 4) -> dict[str, str]:
    """Bring every table's state up to the last commit; return table -> state LSN."""
    commits = sink.commits()
    if not commits:
        return {}
    tables: dict[str, dict[str, Any]] = {}
    for commit in commits:
        tables.update(commit.tables)
    with ThreadPoolExecutor(max_workers=max(1, parallelism)) as pool:
        futures = {
            name: pool.submit(_materialize_table, spark, sink, name, info, commits)
            for name, info in tables.items()
        }
        return {name: future.result() for name, future in futures.items()}


def _materialize_table(
    spark: Any, sink: Sink, table: str, info: dict[str, Any], commits: list[CommitRecord]
) -> str:
    from airflow_pglogrepl.spark.merge import merge_state

    record = _read_record(sink, table)
    if record is not None:
        _finish_swap(sink, table, record)
    state_lsn = LSN(record["lsn"]) if record else None
    pending = [c for c in commits if state_lsn is None or c.end > state_lsn]
    files = [
        sink.storage.join(sink.changes_dir(table), f"{c.window}-{name}")
        for c in pending
        for name in c.files.get(table, [])
    ]
    last = commits[-1].end
    if not files:
        if state_lsn is None or last > state_lsn:
            sink.storage.write_text_atomic(
                _record_path(sink, table), json.dumps({"lsn": str(last), "next": None})
            )
        return str(last)
    changes = spark.read.option("mergeSchema", "true").parquet(*files)
    if state_lsn is not None:
        # A no-op after a window end; after a table's own snapshot inside a window, the changes
        # before its consistent point are in the state already.
        from pyspark.sql import functions as sf

        from airflow_pglogrepl.spark.changelog import COMMIT_LSN

        changes = changes.filter(sf.col(COMMIT_LSN) >= sf.lit(int(state_lsn)))
    previous = None
    if state_lsn is not None and sink.storage.exists(sink.state_dir(table)):
        previous = spark.read.parquet(sink.state_dir(table))
    merged = merge_state(
        previous,
        changes,
        key=info["key"],
        columns=info["columns"],
        full_identity=info.get("replica_identity") == "f",
        table=f"{info.get('schema')}.{info.get('table')}",
    )
    target = sink.storage.join(sink.root, META, "state_next", table, window_id(last))
    merged.write.mode("overwrite").parquet(target)
    new_record = {"lsn": str(last), "next": target}
    sink.storage.write_text_atomic(_record_path(sink, table), json.dumps(new_record))
    _finish_swap(sink, table, new_record)
    log.info("state of %s materialized up to %s (%d changelog files)", table, last, len(files))
    return str(last)


def state_lsn(sink: Sink, table: str) -> LSN | None:
    """The LSN a table's ``state/`` includes (its state record), or None when it has none."""
    record = _read_record(sink, table)
    return LSN(record["lsn"]) if record else None


def install_state(sink: Sink, table: str, lsn: LSN, staged: str) -> None:
    """Make ``staged`` (a directory Spark wrote) the table's state as of ``lsn``, crash-safely.

    The state record pointing at it is the commit point, as for a merge; the swap follows and is
    finished by the next ``materialize`` if a crash interrupts it. Used to re-snapshot one table
    without touching the others.
    """
    record = {"lsn": str(lsn), "next": staged}
    sink.storage.write_text_atomic(_record_path(sink, table), json.dumps(record))
    _finish_swap(sink, table, record)
    log.info("state of %s replaced by its snapshot at %s", table, lsn)
