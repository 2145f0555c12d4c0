"""Keep ``history/<table>``: every version of each row, from the changelog, exactly once.

A history is brought up to the lake's position after the state is (the drain's ``history``
option), from the changes in ``[history position, lake position)`` reduced to versions
(``merge.history_versions``) and applied as one Delta version with the app transaction
``(app_id(slot), lake position)``: new versions appended, the versions they end updated in place
by one MERGE. The commit rules are the state's (``merge.arrow``): the writer lock proven right
before it, a compare-and-set on the transaction version the batch was read against, the log made
durable before the slot may move. A crash anywhere leaves the history at its old position, and
the next run makes the same versions again.

Where a history begins. A table whose state already holds rows (an initial snapshot's, or the
state's of the runs before history was turned on) begins with one version per state row, as
of the state's position, with ``_valid_from_lsn`` NULL: when each was made is not in the lake.
A table with no state yet begins empty, and every version it gets has its exact beginning.

History is merged without a JVM: its batches are the state's batches, and its MERGE touches only
the files holding the versions it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    COMMIT_TS,
    META_COLUMNS,
    OLD,
    OP,
    SEQ,
    UNCHANGED,
    described_identity,
    described_key,
)
from airflow_pglogrepl.changelog.history_columns import (
    ENDING_COLUMNS,
    IS_CURRENT,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    history_fields,
    history_schema,
)
from airflow_pglogrepl.exceptions import LakeCommitConflictError, LakeError
from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake import delta, durability
from airflow_pglogrepl.lake.column_names import former_names, with_current_names
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.changes_range import InRange
from airflow_pglogrepl.merge.history_copies import copies_versions
from airflow_pglogrepl.merge.history_versions import MissingVersionError, Prior, Versions, versions
from airflow_pglogrepl.merge.lineage import INTERNAL
from airflow_pglogrepl.merge.net_upserts import quote
from airflow_pglogrepl.merge.state_files import StateFiles

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")

NEW = f"{INTERNAL}new"  # the merge's source row is a version to insert (else one to end)


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
    return [name for name in names if name in have and name not in held]


def merge_history(lake: Lake, tables: Sequence[str]) -> dict[str, str]:
    """Bring the history of each of ``tables`` up to the lake's position; table -> the LSN its
    history includes now."""
    end = lake.position()
    if end is None:
        return {}
    done = {}
    for name in tables:
        if _merge_table(lake, name, end):
            done[name] = str(end)
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


def _merge_table(lake: Lake, name: str, end: LSN) -> bool:
    """One table's history up to ``end``; whether it is there now."""
    uri = lake.paths.history(name)
    target = delta.open_table(uri)
    have = None if target is None else target.transaction_version(lake.app)
    if have is not None and int(have) >= int(end):
        return True
    changes = delta.open_table(lake.paths.changes(name))
    if changes is None:
        return False
    begin = _Begin(changes)
    if target is None:
        target = _begin(lake, name, begin, end)
        have = None if target is None else target.transaction_version(lake.app)
        if have is not None and int(have) >= int(end):
            return True
    elif any(c not in delta.schema_of(target).names for c in begin.columns):
        delta.evolve_schema(uri, begin.types)
        target = delta.open_table(uri)
    stored = begin.types if target is None else delta.unmapped(delta.schema_of(target))
    batch = begin.read(None if have is None else int(have), int(end))
    if batch.num_rows == 0:  # the position recorded all the same: the history is not behind
        if target is None:
            _create(lake, uri, stored.empty_table(), end)
        else:
            _record(lake, uri, stored, end, have)
        return True
    try:
        made = begin.reduce(batch, _prior(uri, target, begin.keys, stored), stored)
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
    _write(lake, uri, target, have, end, made, stored)
    log.info("history of %s up to %s: %d versions opened, %d earlier ones ended", name, end,
             made.opened.num_rows, made.closed.num_rows)  # fmt: skip
    return True


class _Begin:
    """A table's changelog as the history reads it: its columns, key and identity from the
    schema, its rows in a range of commit LSNs, and their reduction to versions."""

    def __init__(self, changes: Any) -> None:
        import pyarrow as pa

        self.changes = changes
        self.schema = delta.unmapped(pa.schema(changes.schema().to_arrow()))
        fields = [(f.name, _text(f.metadata)) for f in self.schema]
        self.full = described_identity(fields) == "f"
        self.keys = [] if self.full else described_key(fields)
        self.columns = [n for n, _ in fields if n not in META_COLUMNS]
        self.types = history_schema(pa.schema([self.schema.field(c) for c in self.columns]))

    def read(self, have: int | None, end: int) -> pa.Table:
        """The changelog's rows with ``have <= _commit_lsn < end``, columns by today's names."""
        import pyarrow as pa

        needed = [c for c in [*self.columns, OP, COMMIT_LSN, SEQ, COMMIT_TS, UNCHANGED, OLD]
                  if c in self.schema.names]  # fmt: skip
        in_range = InRange(self.changes, self.schema, have, end)
        batch = with_current_names(in_range.read(needed), former_names(self.schema))
        if COMMIT_TS not in batch.column_names:  # (a changelog from before commit times)
            stamp = history_fields()[2].type
            batch = batch.append_column(COMMIT_TS, pa.nulls(batch.num_rows, stamp))
        return batch

    def reduce(self, batch: pa.Table, prior: Prior, stored: pa.Schema | None = None) -> Versions:
        types = self.types if stored is None else stored
        if self.full:
            return copies_versions(batch, self.columns, prior, types)
        return versions(batch, self.columns, self.keys, prior=prior, types=types)


def _begin(lake: Lake, name: str, begin: _Begin, end: LSN) -> Any | None:
    """A new history as of the state's position, when a state holds rows (None: no state; the
    history begins with the changelog). Built from the changelog when replaying it gives the
    state exactly (the lake began this table with the drain: every version is in its log),
    else one version per state row with no known beginning (a snapshot's rows)."""
    state_uri = lake.paths.state(name)
    state = delta.open_table(state_uri)
    at = None if state is None else state.transaction_version(lake.app)
    if state is None or at is None or int(at) > int(end):
        return None
    types = begin.types
    have = delta.unmapped(delta.schema_of(state)).names
    rows = delta.scan(state_uri, version=int(state.version()),
                      columns=[f.name for f in types if f.name in have])  # fmt: skip
    replayed = _replayed(begin, int(at), rows)
    if replayed is not None:
        versions_, how = replayed, "replayed from the changelog"
    else:
        versions_, how = _begun_rows(rows, types), "one version per row, beginning unknown"
    _create(lake, lake.paths.history(name), versions_, LSN(int(at)))
    log.info("history of %s begun at the state's position %s: %d versions (%s)", name,
             LSN(int(at)), versions_.num_rows, how)  # fmt: skip
    return delta.open_table(lake.paths.history(name))


def _replayed(begin: _Begin, at: int, state: pa.Table) -> pa.Table | None:
    """Every version the changelog holds below ``at``, when their current ones are the state's
    rows (as multisets); else None."""
    import pyarrow as pa

    batch = begin.read(None, at)
    if batch.num_rows == 0:
        return None
    try:
        made = begin.reduce(batch, lambda _: begin.types.empty_table())
        current = made.opened.filter(made.opened.column(IS_CURRENT))
        columns = [c for c in begin.columns if c in state.column_names]
        if len(columns) != len(begin.columns) or made.orphans:
            return None
        wanted = pa.schema([begin.types.field(c) for c in columns])
        order = [(c, "ascending") for c in columns]
        ours = current.select(columns).cast(wanted).sort_by(order)
        theirs = state.select(columns).cast(wanted).sort_by(order)
    except (MissingVersionError, pa.ArrowException, ValueError, TypeError):
        return None  # (a row nowhere, a type Arrow cannot sort: begun from the state)
    return _conformed(made.opened, begin.types) if ours.equals(theirs) else None


def _begun_rows(rows: pa.Table, types: pa.Schema) -> pa.Table:
    """One current version per state row, NULL where it began (``_valid_from_seq`` numbers them:
    copies of a row without a key stay apart)."""
    import pyarrow as pa

    count = rows.num_rows
    arrays = []
    for field in types:
        if field.name in rows.column_names:
            arrays.append(rows.column(field.name).cast(field.type))
        elif field.name == VALID_FROM_SEQ:
            arrays.append(pa.array(range(count), type=pa.int64()))
        elif field.name == IS_CURRENT:
            arrays.append(pa.array([True] * count, type=pa.bool_()))
        else:
            arrays.append(pa.nulls(count, field.type))
    return pa.table(arrays, schema=types)


def _prior(uri: str, target: Any | None, keys: Sequence[str], types: pa.Schema) -> Prior:
    """How the reduction reads the history's current versions (all, or those of some keys), at
    the version the batch is read against."""
    import pyarrow as pa

    def read(wanted: pa.Table | None) -> pa.Table:
        if target is None:
            return types.empty_table()
        rows = delta.scan(uri, version=int(target.version()), where=quote(IS_CURRENT))
        rows = rows.cast(pa.schema([types.field(c) for c in rows.column_names]))
        if wanted is None or not keys:
            return rows
        picked = wanted.select(list(keys)).group_by(list(keys)).aggregate([])
        return rows.join(picked.cast(rows.select(list(keys)).schema), list(keys),
                         join_type="left semi")  # fmt: skip

    return read


def _write(lake: Lake, uri: str, target: Any | None, have: int | None, end: LSN,
           made: Versions, stored: pa.Schema) -> None:  # fmt: skip
    """The batch's versions as the history's next version: created, appended, or (when it ends
    earlier versions) one MERGE, each right after the writer lock is proven."""
    fault("history_created")
    opened = _conformed(made.opened, stored)
    if target is None:
        _create(lake, uri, opened, end)
    elif made.closed.num_rows == 0:
        with StateFiles(uri, stored, f"{int(end):016X}") as files:
            files.write(opened)

            def commit(written: list[delta.DataFile]) -> None:
                lake.check_writer()
                delta.commit_files(uri, stored, written, app=lake.app, version=int(end),
                                   expected=None if have is None else int(have))  # fmt: skip

            files.commit(commit)
    else:
        _merge(lake, uri, target, have, end, made, opened, stored)
    fault("history_committed")


def _create(lake: Lake, uri: str, rows: pa.Table, end: LSN) -> None:
    """A history's first version: ``rows`` with the app transaction ``(lake.app, end)``, put
    only if no table appeared meanwhile; configured as a new state (deletion vectors as the
    lake makes them), never under column mapping."""
    config = lake.state_config(uri.rsplit("/", 1)[-1], mapped=False)
    config = {k: v for k, v in config.items() if not k.startswith("delta.columnMapping")}
    with StateFiles(uri, rows.schema, f"{int(end):016X}") as files:
        files.write(rows)

        def commit(written: list[delta.DataFile]) -> None:
            lake.check_writer()
            delta.create_table(uri, rows.schema, written, app=lake.app, version=int(end),
                               configuration=config)  # fmt: skip

        files.commit(commit)


def _merge(lake: Lake, uri: str, target: Any, have: int | None, end: LSN, made: Versions,
           opened: pa.Table, stored: pa.Schema) -> None:  # fmt: skip
    """One MERGE: versions the batch ends updated (matched by key among the current ones, or
    by their beginning for a table without a key), the new ones inserted."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction

    closes = _conformed(made.closed, stored)
    source = pa.concat_tables([opened, closes])
    flags = [True] * opened.num_rows + [False] * closes.num_rows
    source = source.append_column(NEW, pa.array(flags, type=pa.bool_()))
    if made.match == (VALID_FROM_LSN, VALID_FROM_SEQ):
        on = [f"(t.{quote(m)} IS NOT DISTINCT FROM s.{quote(m)})" for m in made.match]
    else:
        on = [f"t.{quote(m)} = s.{quote(m)}" for m in made.match]
    on += [f"t.{quote(IS_CURRENT)}", f"NOT s.{quote(NEW)}"]
    before = int(target.version())
    if (None if have is None else int(have)) != target.transaction_version(lake.app):
        raise LakeCommitConflictError(uri, lake.app, have, target.transaction_version(lake.app),
                                      int(end))  # fmt: skip
    commit = CommitProperties(app_transactions=[Transaction(lake.app, int(end))])
    lake.check_writer()
    merger = target.merge(source, " AND ".join(on), source_alias="s", target_alias="t",
                          commit_properties=commit)  # fmt: skip
    merger = merger.when_matched_update(updates={quote(c): f"s.{quote(c)}" for c in ENDING_COLUMNS})
    insert = {quote(f.name): f"s.{quote(f.name)}" for f in stored}
    metrics = merger.when_not_matched_insert(updates=insert, predicate=f"s.{quote(NEW)}").execute()
    missed = closes.num_rows - int(metrics.get("num_target_rows_updated", closes.num_rows))
    if missed > 0:
        log.warning("history at %s: %d changes ended a version the history does not hold "
                    "(rows it never had)", uri, missed)  # fmt: skip
    if is_local(uri):
        durability.make_log_durable(uri, after=before)
    if delta.txn_version(uri, lake.app) != int(end):
        _record(lake, uri, stored, end, have)


def _conformed(rows: pa.Table, stored: pa.Schema) -> pa.Table:
    """``rows`` in the history's column order and types; a column they lack (dropped at the
    source, or only in the key and ending columns of versions to end) NULL."""
    import pyarrow as pa

    arrays = [rows.column(f.name).cast(f.type) if f.name in rows.column_names
              else pa.nulls(rows.num_rows, f.type) for f in stored]  # fmt: skip
    return pa.table(arrays, schema=stored)


def _record(lake: Lake, uri: str, stored: pa.Schema, end: LSN, have: int | None) -> None:
    """A version with no files that says the history includes the changes up to ``end``."""
    lake.check_writer()
    delta.commit_files(uri, stored, [], app=lake.app, version=int(end),
                       expected=None if have is None else int(have))  # fmt: skip


def _text(metadata: dict[bytes, bytes] | None) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (metadata or {}).items()}
