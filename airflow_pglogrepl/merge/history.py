"""Keep ``history/<table>``: every version of each row, from the changelog, exactly once.

A history is brought up to the lake's position after the state is (the drain's ``history``
option), from the changes in ``[history position, lake position)`` reduced to versions
(``merge.history_changes``) and applied as one Delta version (``merge.history_writes``): new
versions appended, the versions they end updated in place by one MERGE. A crash anywhere leaves
the history at its old position, and the next run makes the same versions again.

Where a history begins, and where it begins again after the table was copied from the source
once more, is the state's (``merge.history_state``).

History is merged without a JVM: its batches are the state's batches, and its MERGE touches only
the files holding the versions it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.history_columns import IS_CURRENT
from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import history_writes as writes
from airflow_pglogrepl.merge.history_changes import TableChanges, conformed
from airflow_pglogrepl.merge.history_state import (
    STATE_VERSION,
    beginning,
    copies_since,
    resync_rows,
    seen_state_version,
    state_version,
)
from airflow_pglogrepl.merge.history_versions import MissingVersionError, Prior
from airflow_pglogrepl.merge.net_upserts import quote

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")


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
    import pyarrow as pa

    uri = lake.paths.history(name)
    changes = delta.open_table(lake.paths.changes(name))
    if changes is None:
        return False
    table = TableChanges(changes)
    seen = {STATE_VERSION: str(state_version(lake, name))}  # read first: what this commit saw
    target = delta.open_table(uri)
    if target is None:
        begun = beginning(lake, name, table, end)
        if begun is not None:
            state_seen = {STATE_VERSION: str(begun.state_version)}
            writes.create(lake, uri, begun.rows, begun.at, state_seen)
            log.info("history of %s begun at the state's position %s: %d versions (%s)", name,
                     begun.at, begun.rows.num_rows, begun.how)  # fmt: skip
            target = delta.open_table(uri)
    elif any(c not in delta.schema_of(target).names for c in table.columns):
        delta.evolve_schema(uri, table.types)
        target = delta.open_table(uri)
    have = None if target is None else target.transaction_version(lake.app)
    copies = [] if target is None else copies_since(lake, name, seen_state_version(target))
    if have is not None and int(have) >= int(end) and not copies:
        return True
    stored = table.types if target is None else delta.unmapped(delta.schema_of(target))
    batch = table.read(None if have is None else int(have), int(end))
    for copy in copies:
        resync = resync_rows(lake, name, table, copy, have, batch.schema)
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
    else:  # (a copy taken at the history's position is a MERGE at the same position)
        writes.merge(lake, uri, target, have, at, made, stored, seen)
    fault("history_committed")
    log.info("history of %s up to %s: %d versions opened, %d earlier ones ended", name, at,
             made.opened.num_rows, made.closed.num_rows)  # fmt: skip
    return True


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
