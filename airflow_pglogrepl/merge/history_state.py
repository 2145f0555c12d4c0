"""Where a history begins, and begins again: the table's state, and the copies that replace it.

A history begins at the state's position. When replaying the changelog below that position
gives exactly the state's rows, the lake began this table with the drain and every version is in
its log: the history is that replay, exact. Otherwise (an initial snapshot's rows, whose
beginnings are not in the lake) it is one version per state row, ``_valid_from_lsn`` NULL.

A state replaced whole from a copy of the source (a re-snapshot, an online backfill's build:
their commits carry ``delta.REWRITTEN``) makes the changelog no record of what the copy took:
changes below the copy's point may be missing (the drain drops them), and rows may be in the
copy that no change brought (an attached partition's). So the history begins again there: every
current version ends with ``resync`` at the copy's point, and each row of the copy begins a
version. Each history commit records the state version it saw (``STATE_VERSION`` in its
commit's metadata), so each copy is taken once, whatever crashes in between.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import COMMIT_LSN, OP, SEQ, UNCHANGED
from airflow_pglogrepl.changelog.history_columns import IS_CURRENT, VALID_FROM_SEQ
from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.commit_infos import newest_first
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.history_changes import TableChanges, conformed
from airflow_pglogrepl.merge.history_versions import RESYNC_OP, MissingVersionError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")

# A history begun from a changelog of more Arrow bytes than this begins from the state's rows
# instead: the replay holds the whole changelog in memory at once.
REPLAY_BYTES = 512 << 20
# In each history commit's metadata: the state's Delta version the history had seen.
STATE_VERSION = "pglogrepl.state_version"


@dataclass(frozen=True)
class Beginning:
    """A new history's first version: ``rows`` at the state's position ``at``."""

    rows: pa.Table
    at: LSN
    state_version: int
    how: str


@dataclass(frozen=True)
class Copy:
    """A state replaced whole from a copy of the source: at Delta ``version``, holding the
    changes below ``at``."""

    version: int
    at: LSN


def beginning(lake: Lake, name: str, table: TableChanges, end: LSN) -> Beginning | None:
    """A new history of ``name`` at its state's position (None: no state to begin from; the
    history begins with the changelog)."""
    state = delta.open_table(lake.paths.state(name))
    at = None if state is None else state.transaction_version(lake.app)
    if state is None or at is None or int(at) > int(end):
        return None
    version = int(state.version())
    rows = _state_rows(lake, name, version, table)
    replayed = (
        None if _copies(state, lake.paths.state(name), 0) else _replayed(table, int(at), rows)
    )
    if replayed is not None:
        return Beginning(replayed, LSN(int(at)), version, "replayed from the changelog")
    return Beginning(_begun_rows(rows, table.types), LSN(int(at)), version,
                     "one version per row, beginning unknown")  # fmt: skip


def state_ahead(lake: Lake, name: str, end: LSN) -> bool:
    """Whether the state holds changes past ``end`` (re-snapshotted ahead of the drain)."""
    state = delta.open_table(lake.paths.state(name))
    at = None if state is None else state.transaction_version(lake.app)
    return at is not None and int(at) > int(end)


def state_version(lake: Lake, name: str) -> int:
    """The state's Delta version now (-1: no state yet: whatever makes it comes after)."""
    state = delta.open_table(lake.paths.state(name))
    return -1 if state is None else int(state.version())


def seen_state_version(history: Any, uri: str) -> int:
    """The state version the newest commit of ``history`` (the table at ``uri``, as the lake
    names it: a table's own ``table_uri`` comes percent-encoded) that says one had seen; -1
    when none says (every copy of the state is then still to take). Commits that are not the
    history's own merges (a column added, a compaction by hand) say none: the ones before them
    do."""
    for entry in newest_first(uri, int(history.version())):
        value = entry.get(STATE_VERSION, _in_user_metadata(entry.get("userMetadata")))
        if value is not None:
            return int(value)
    return -1


def _in_user_metadata(text: Any) -> Any:
    """The state version a Spark commit says in its ``userMetadata`` (``merge.history_spark``
    writes the same keys there as JSON); None: it says none."""
    import json

    if not isinstance(text, str) or not text.startswith("{"):
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found.get(STATE_VERSION) if isinstance(found, dict) else None


def copies_since(lake: Lake, name: str, seen: int, have: int | None) -> list[Copy]:
    """The state's versions after ``seen`` that replaced it from a copy, oldest first, each at
    the point its rows begin in the history (the copy's, or the history's position if past
    it). Of copies at one point only the newest counts: the ones before it were never the
    table at any position."""
    state = delta.open_table(lake.paths.state(name))
    if state is None:
        return []
    by_point: dict[int, Copy] = {}
    for version in _copies(state, lake.paths.state(name), seen + 1):
        at = delta.open_table(lake.paths.state(name), version=version)
        txn = None if at is None else at.transaction_version(lake.app)
        if txn is not None:
            point = max(int(txn), -1 if have is None else int(have))
            by_point[point] = Copy(version, LSN(point))  # (versions ascend: the newest stays)
    return [by_point[point] for point in sorted(by_point)]


def resync_rows(lake: Lake, name: str, table: TableChanges, copy: Copy,
                schema: pa.Schema) -> pa.Table:  # fmt: skip
    """A copy as changelog rows (``schema``'s): one ``RESYNC_OP`` that ends every current
    version, then an insert per row of the copy, at the copy's point, numbered below every
    real change there."""
    import pyarrow as pa

    try:
        rows = _state_rows(lake, name, copy.version, table)
    except Exception as exc:  # (its files vacuumed, its log entry cleaned up)
        raise LakeError(
            f"history of {name} cannot take the copy the state was replaced with at its "
            f"version {copy.version} ({type(exc).__name__}: {exc}): the lake no longer holds "
            f"it. Nothing was written to history/{name}. Fix: delete the directory "
            f"history/{name}; the next run begins the history again from the state"
        ) from exc
    at = int(copy.at)
    count = rows.num_rows
    ops = [RESYNC_OP] + ["I"] * count
    columns = {}
    for field in schema:
        if field.name in rows.column_names:
            values = pa.concat_arrays(
                [pa.nulls(1, field.type), rows.column(field.name).cast(field.type).combine_chunks()]
            )
        elif field.name == OP:
            values = pa.array(ops, type=field.type)
        elif field.name == COMMIT_LSN:
            values = pa.array([at] * (count + 1), type=field.type)
        elif field.name == SEQ:
            values = pa.array(range(-count - 1, 0), type=field.type)
        elif field.name == UNCHANGED:
            values = pa.array([[] for _ in ops], type=field.type)
        else:  # (the commit time, the old row: none)
            values = pa.nulls(count + 1, field.type)
        columns[field.name] = values
    log.warning("history of %s begins again at %s: the table was copied from the source "
                "there (%d rows); its current versions end with 'resync'", name, LSN(at),
                count)  # fmt: skip
    return pa.table(columns, schema=schema)


def _copies(state: Any, uri: str, start: int) -> list[int]:
    """The versions from ``start`` on whose commit says they replaced the state (at ``uri``)
    from a copy."""
    newest = int(state.version())
    return sorted(int(entry["version"]) for entry in newest_first(uri, newest, start)
                  if entry.get("userMetadata") == delta.REWRITTEN)  # fmt: skip


def _state_rows(lake: Lake, name: str, version: int, table: TableChanges) -> pa.Table:
    uri = lake.paths.state(name)
    state = delta.open_table(uri, version=version)
    have = set() if state is None else set(delta.unmapped(delta.schema_of(state)).names)
    return delta.scan(uri, version=version, columns=[c for c in table.columns if c in have])


def _replayed(table: TableChanges, at: int, state: pa.Table) -> pa.Table | None:
    """Every version the changelog holds below ``at``, when their current ones are the state's
    rows (as multisets); else None."""
    import pyarrow as pa

    if table.size_bytes(None, at) > REPLAY_BYTES:  # (a replay that would not fit in memory)
        return None
    batch = table.read(None, at)
    if batch.num_rows == 0:
        return None
    try:
        made = table.reduce(batch, lambda _: table.types.empty_table())
        current = made.opened.filter(made.opened.column(IS_CURRENT))
        columns = [c for c in table.columns if c in state.column_names]
        if len(columns) != len(table.columns) or made.orphans or made.closed.num_rows:
            return None  # (a change of a row the replay never began: not the whole story)
        wanted = pa.schema([table.types.field(c) for c in columns])
        order = [(c, "ascending") for c in columns]
        ours = current.select(columns).cast(wanted).sort_by(order)
        theirs = state.select(columns).cast(wanted).sort_by(order)
    except (MissingVersionError, pa.ArrowException, ValueError, TypeError):
        return None  # (a row nowhere, a type Arrow cannot sort: begun from the state)
    return conformed(made.opened, table.types) if ours.equals(theirs) else None


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
