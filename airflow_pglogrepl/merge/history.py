"""Keep ``history/<table>``: every version of each row, from the changelog, exactly once.

A history is brought up to the lake's position after the state is (the drain's ``history``
option), from the changes in ``[history position, lake position)`` reduced to versions
(``merge.history_changes``) and applied as one Delta version (``merge.history_writes``): new
versions appended, the versions they end updated in place by one MERGE. A crash anywhere leaves
the history at its old position, and the next run makes the same versions again.

Where a history begins, and where it begins again after the table was copied from the source
once more, is the state's (``merge.history_state``).

A batch is reduced without a JVM, and held in memory: a history far behind (turned on over a
long changelog, an initial load through the slot) catches up in steps of bounded size, each its
own commit (``merge.history_steps``). The MERGE runs on delta-rs, which writes again the files
holding the versions it ends; once the history is big, on Spark (``merge.history_spark``), which
marks them in deletion vectors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.history_columns import HISTORY_COLUMNS, IS_CURRENT
from airflow_pglogrepl.exceptions import (
    LakeCommitConflictError,
    LakeError,
    LakeWriterBusyError,
    PgLogReplError,
    WriterLockLostError,
)
from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.column_names import former_names
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import history_writes as writes
from airflow_pglogrepl.merge.history_changes import TableChanges, conformed, fills
from airflow_pglogrepl.merge.history_spark import merge_on_spark, on_spark
from airflow_pglogrepl.merge.history_state import (
    STATE_VERSION,
    Copy,
    beginning,
    copies_since,
    resync_rows,
    seen_state_version,
    state_ahead,
    state_version,
)
from airflow_pglogrepl.merge.history_steps import steps
from airflow_pglogrepl.merge.history_versions import MissingVersionError, Prior
from airflow_pglogrepl.merge.lineage import INTERNAL
from airflow_pglogrepl.merge.net_upserts import quote

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")

Spark = Callable[[], Any]  # returns a Spark session: called only when one is needed
PRIOR_CHUNK_BYTES = 64 << 20  # current versions scanned before each join with the keys wanted


def history_tables(lake: Lake, wanted: bool | Sequence[str]) -> list[str]:
    """The tables (directory names) whose history to keep: every table of the changelog for
    ``True``, else those of ``wanted`` (``schema.table`` names) the changelog has; none held
    (in quarantine, being backfilled: ``merge.materialize.held_tables``)."""
    from airflow_pglogrepl.lake.layout import table_dir
    from airflow_pglogrepl.merge.materialize import held_tables
    from airflow_pglogrepl.tables import TableRef

    if not wanted:
        return []
    have = delta.list_tables(lake.paths.changes("").rstrip("/"))
    names = have if wanted is True else [table_dir(TableRef.parse(t)) for t in wanted]
    held = held_tables(lake)
    missing = [name for name in names if name not in have]
    if missing:  # (a typo, or a table no change of has reached the lake yet)
        log.warning("history asked for %s, which the lake holds no changelog of (yet): check "
                    "the names (schema.table)", ", ".join(missing))  # fmt: skip
    waiting = [name for name in names if name in have and name in held]
    if waiting:
        log.info("history of %s waits: quarantined or being backfilled", ", ".join(waiting))
    return [name for name in names if name in have and name not in held]


def merge_history(lake: Lake, tables: Sequence[str], spark: Spark | None = None,
                  spark_bytes: int | None = None) -> dict[str, str]:  # fmt: skip
    """Bring the history of each of ``tables`` up to the lake's position; table -> the LSN its
    history includes now. ``spark``: a function that returns a session, called only when a
    batch ends versions of a history past ``spark_bytes`` of files (``history_spark``; default
    ``SPARK_BYTES``); None: delta-rs merges all. A
    table whose history fails does not stop the others: each is tried, then one error names
    every table that failed (the lake's own refusals, a lost lock or a commit another writer
    made, stop the run at once)."""
    end = lake.position()
    if end is None:
        return {}
    done: dict[str, str] = {}
    failed: dict[str, BaseException] = {}
    for name in tables:
        try:
            if _merge_table(lake, name, end, spark, spark_bytes):
                done[name] = str(end)
        except (LakeCommitConflictError, LakeWriterBusyError, WriterLockLostError):
            raise
        except Exception as exc:  # (delta-rs raises its own classes: one table's, not the run's)
            failed[name] = exc
            log.error("history of %s not merged: %s: %s", name, type(exc).__name__, exc)
        except BaseException as exc:  # delta-rs' panics derive from BaseException
            if type(exc).__name__ != "PanicException":
                raise
            failed[name] = exc
            log.error("history of %s not merged: %s: %s", name, type(exc).__name__, exc)
    if failed:
        named = "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in failed.items())
        raise LakeError(f"the history of {len(failed)} table(s) could not be merged ({named}). "
                        f"The others were; the windows and states are committed. Fix: as each "
                        f"error says, or leave the table out of history=[...]")  # fmt: skip
    return done


def histories_behind(lake: Lake, wanted: bool | Sequence[str]) -> list[str]:
    """The tables of ``wanted`` (``history_tables``) whose history is behind the lake's
    position: a run that merges nothing else still has them to do."""
    end = lake.position()
    if end is None:
        return []
    behind = []
    for name in history_tables(lake, wanted):
        found = history_position(lake, name)
        if found is None or found < end:
            behind.append(name)
    return behind


def history_position(lake: Lake, name: str) -> LSN | None:
    """The lake position the history of ``name`` includes (None: no history yet)."""
    found = delta.txn_version(lake.paths.history(name), lake.app)
    return None if found is None else LSN(found)


def _merge_table(lake: Lake, name: str, end: LSN, spark: Spark | None = None,
                 spark_bytes: int | None = None) -> bool:  # fmt: skip
    """One table's history up to ``end``, in steps of bounded size (``history_steps``); whether
    it is there now."""
    changes = delta.open_table(lake.paths.changes(name))
    if changes is None:
        return False
    table = TableChanges(changes)
    _refuse_clashes(name, table)
    ends: list[int] | None = None
    while True:
        seen = state_version(lake, name)  # read first: what this commit saw
        target = _opened(lake, name, table, end)
        if target is _WAIT:
            return False
        have = None if target is None else target.transaction_version(lake.app)
        if ends is None:
            ends = steps(table, have, int(end))
        step = LSN(next((e for e in ends if have is None or e > int(have)), int(end)))
        uri = lake.paths.history(name)
        copies = (
            []
            if target is None
            else copies_since(lake, name, seen_state_version(target, uri), have)
        )
        later = [c for c in copies if c.at > step]  # taken once the history gets there
        if later:
            copies, seen = [c for c in copies if c.at <= step], later[0].version - 1
        if have is None or int(have) < int(step) or copies:
            _merge_batch(lake, name, table, target, have, step, copies,
                         {STATE_VERSION: str(seen)}, spark, spark_bytes)  # fmt: skip
        if step >= end:
            return True
        log.info("history of %s up to %s of %s: its catch-up goes on in steps", name, step, end)


_WAIT = object()  # a history not to begin yet


def _opened(lake: Lake, name: str, table: TableChanges, end: LSN) -> Any:
    """The history table, begun from the state if there is none yet, its columns brought to
    the changelog's; None: none (it begins with the changelog); ``_WAIT``: the state is past the
    lake's position (a re-snapshot ahead of the drain), where the history begins later."""
    uri = lake.paths.history(name)
    target = delta.open_table(uri)
    if target is None:
        if state_ahead(lake, name, end):
            log.info("history of %s begins once the lake reaches its state's position", name)
            return _WAIT
        begun = beginning(lake, name, table, end)
        if begun is None:
            return None
        writes.create(lake, uri, begun.rows, begun.at, {STATE_VERSION: str(begun.state_version)})
        log.info("history of %s begun at the state's position %s: %d versions (%s)", name,
                 begun.at, begun.rows.num_rows, begun.how)  # fmt: skip
        return delta.open_table(uri)
    stored = delta.unmapped(delta.schema_of(target)).names
    renames = {former: now for former, now in former_names(table.schema).items()
               if former in stored and now not in stored}  # fmt: skip
    if renames:
        writes.rename(lake, uri, target, renames, seen_state_version(target, uri))
        target = delta.open_table(uri)
    have = delta.schema_of(target).names
    added = [c for c in table.columns if c not in have]
    filled = {c: value for c, (_, value) in fills(table.schema).items() if c in added}
    if filled:  # (its versions all began before the column: they hold its fill)
        writes.add_filled(lake, uri, target, filled, table.types,
                          seen_state_version(target, uri))  # fmt: skip
        target = delta.open_table(uri)
    elif added:
        lake.check_writer()
        delta.evolve_schema(uri, table.types)
        target = delta.open_table(uri)
    return target


def _merge_batch(lake: Lake, name: str, table: TableChanges, target: Any | None,
                 have: int | None, end: LSN, copies: list[Copy], seen: dict[str, str],
                 spark: Spark | None, spark_bytes: int | None) -> bool:  # fmt: skip
    """The changes in ``[have, end)`` and the copies taken meanwhile, as one commit."""
    import pyarrow as pa

    uri = lake.paths.history(name)
    stored = table.types if target is None else delta.unmapped(delta.schema_of(target))
    batch = table.read(None if have is None else int(have), int(end))
    for copy in copies:
        resync = resync_rows(lake, name, table, copy, batch.schema)
        batch = pa.concat_tables([batch, resync.cast(batch.schema)])
    at = end if have is None else max(end, LSN(int(have)))
    if batch.num_rows == 0:  # the position recorded all the same: the history is not behind
        if target is None:
            writes.create(lake, uri, stored.empty_table(), at, seen)
        else:
            writes.record(lake, uri, stored, at, have, seen)
        return True
    try:
        made = table.reduce(batch, _prior(uri, target, table.keys, stored), stored)
    except MissingVersionError as missing:
        raise LakeError(
            f"changes of {name} hold an update whose unchanged TOAST values have no earlier "
            f"version to keep: row {missing.key} is in neither the history nor the batch. "
            f"Nothing was written to history/{name}. Fix: delete the directory "
            f"history/{name}; the next run begins the history again from the state"
        ) from None
    if made.orphans:
        log.warning("history of %s: %d changes ended a version the history does not hold "
                    "(rows it never had)", name, made.orphans)  # fmt: skip
    fault("history_created")
    opened = conformed(made.opened, stored)
    if target is None:
        writes.create(lake, uri, opened, at, seen)
    elif made.closed.num_rows == 0 and not copies:
        writes.append(lake, uri, opened, at, have, seen)
    elif spark is not None and int(at) != have and on_spark(target, made, spark_bytes):
        merge_on_spark(spark().newSession(), lake, uri, target, have, at, made, stored, seen)
    else:  # (a copy taken at the history's position is a MERGE at the same position)
        try:
            writes.merge(lake, uri, target, have, at, made, stored, seen)
        except PgLogReplError:
            raise  # the lake's own refusals (a lost lock, a commit moved): not Spark's to redo
        except Exception as exc:  # delta-rs' own classes: nothing was committed
            if spark is None or int(at) == have or delta.lost_race(exc):
                raise
            log.warning("history of %s: the MERGE without a JVM failed (%s: %s); Spark merges "
                        "it", name, type(exc).__name__, exc)  # fmt: skip
            merge_on_spark(spark().newSession(), lake, uri, target, have, at, made, stored, seen)
    fault("history_committed")
    log.info("history of %s up to %s: %d versions opened, %d earlier ones ended", name, at,
             made.opened.num_rows, made.closed.num_rows)  # fmt: skip
    return True


def _refuse_clashes(name: str, table: TableChanges) -> None:
    """A column named like a history column, or like the merge's own, is refused: the history
    could not hold both."""
    clashes = [c for c in table.columns if c in HISTORY_COLUMNS or c.startswith(INTERNAL)]
    if clashes:
        raise LakeError(
            f"history/{name} cannot be kept: the table has column(s) {clashes}, named like "
            f"the history's own ({', '.join(HISTORY_COLUMNS)}, {INTERNAL}...). Nothing was "
            f"written. Fix: rename the column at the source, or leave the table out of "
            f"history=[...]"
        )


def _prior(uri: str, target: Any | None, keys: Sequence[str], types: pa.Schema) -> Prior:
    """How the reduction reads the history's current versions (all, or those of some keys), at
    the version the batch is read against. Those of some keys are read batch by batch, each
    joined with the keys a chunk of about ``PRIOR_CHUNK_BYTES`` at a time (each join builds its
    table of the keys again): what is held is the versions wanted and one chunk, not every
    current one (a single integer key also skips the files outside the keys' range by their
    statistics)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def read(wanted: pa.Table | None) -> pa.Table:
        if target is None:
            return types.empty_table()
        version = int(target.version())
        if wanted is None or not keys:
            rows = delta.scan(uri, version=version, where=quote(IS_CURRENT))
            return rows.cast(pa.schema([types.field(c) for c in rows.column_names]))
        picked = wanted.select(list(keys)).group_by(list(keys)).aggregate([])
        picked = picked.cast(pa.schema([types.field(k) for k in keys]))
        where = quote(IS_CURRENT)
        if len(keys) == 1 and pa.types.is_integer(types.field(keys[0]).type) and picked.num_rows:
            low, high = (int(v.as_py()) for v in pc.min_max(picked.column(0)).values())
            where += f" AND {quote(keys[0])} >= {low} AND {quote(keys[0])} <= {high}"
        parts = [chunk.join(picked, list(keys), join_type="left semi")
                 for chunk in _chunks(_scanned(uri, version, where, types))]  # fmt: skip
        if not parts:
            return types.empty_table()
        return pa.concat_tables(parts)

    return read


def _chunks(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``parts`` gathered into tables of about ``PRIOR_CHUNK_BYTES``."""
    import pyarrow as pa

    held: list[pa.Table] = []
    for part in parts:
        held.append(part)
        if sum(p.nbytes for p in held) >= PRIOR_CHUNK_BYTES:
            yield pa.concat_tables(held)
            held = []
    if held:
        yield pa.concat_tables(held)


def _scanned(uri: str, version: int, where: str, types: pa.Schema) -> Iterator[pa.Table]:
    """The history's rows at ``version`` matching ``where``, one scanned batch at a time, in
    the history's types (DataFusion gives strings as views)."""
    import pyarrow as pa

    from airflow_pglogrepl.lake.storage import delta_options

    opened = delta.open_table(uri, version)
    table = opened if opened is not None else _delta_table(uri, version, delta_options(uri))
    reader = pa.RecordBatchReader.from_stream(table.scan(predicate=where))
    for batch in reader:
        part = pa.Table.from_batches([batch])
        yield part.cast(pa.schema([types.field(c) for c in part.column_names]))


def _delta_table(uri: str, version: int, options: dict[str, str] | None) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(uri, version=version, storage_options=options)
