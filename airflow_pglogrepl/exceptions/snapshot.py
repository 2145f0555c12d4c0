"""Errors of the initial snapshot's reads: locks, rewritten tables, a changed catalog, the Arrow
peek."""

from __future__ import annotations

from airflow_pglogrepl.exceptions.base import PgLogReplError


class SnapshotReadError(PgLogReplError):
    """A snapshot reader's session, its import of the exported snapshot, or its read failed."""

    retryable = True


class SnapshotLockError(SnapshotReadError):
    """The snapshot could not lock a table it copies, so nothing was copied."""

    def __init__(self, table: str, waited_s: float, holders: list[str]) -> None:
        self.table = table
        who = "; ".join(holders) if holders else "a session this role cannot see"
        super().__init__(
            f"the snapshot could not lock {table} (ACCESS SHARE) within {waited_s:g}s, "
            f"because of an ACCESS EXCLUSIVE lock (VACUUM FULL, CLUSTER, TRUNCATE, ALTER TABLE, "
            f"LOCK): {who}. Nothing was copied. Fix: let that statement finish (or end it) and "
            f"run the snapshot again, or raise lock_timeout"
        )


class TableRewrittenError(SnapshotReadError):
    """A copied table was rewritten or replaced between the snapshot and its lock."""

    def __init__(self, tables: list[str]) -> None:
        self.tables = tables
        super().__init__(
            f"table(s) {', '.join(tables)} were rewritten or replaced (VACUUM FULL, CLUSTER, "
            f"TRUNCATE, pg_repack, a rewriting ALTER TABLE, DROP and CREATE) after the "
            f"snapshot's consistent point and before the snapshot locked them: read in the "
            f"snapshot they would look empty or have rows at other places, and a rewrite sends "
            f"no change the drain could repair with. Nothing was copied. Fix: run the snapshot "
            f"again; from the moment it holds its locks, no rewrite can land until it is done"
        )


class SnapshotWaitError(SnapshotReadError):
    """An exported snapshot was not ready in time: the server waits for every transaction
    that holds a transaction id when the slot is created, and one stayed open."""

    retryable = True

    def __init__(self, slot: str, waited_s: float) -> None:
        self.slot = slot
        super().__init__(
            f"creating slot {slot!r} with an exported snapshot waited {waited_s:.0f} s for "
            f"transactions open when it began, and was canceled. Fix: find them in "
            f"pg_stat_activity (backend_xid not null, the oldest xact_start) and "
            f"pg_prepared_xacts, end or commit them, and run again"
        )


class CatalogChangedError(SnapshotReadError):
    """What a snapshot's copy depends on in the catalog changed after its consistent point."""

    def __init__(self, differences: list[str]) -> None:
        self.differences = differences
        shown = "; ".join(differences[:10]) + (" ..." if len(differences) > 10 else "")
        super().__init__(
            f"the catalog changed after the snapshot's consistent point, so the copy would not "
            f"be the tables at that point (a table added to or dropped from a publication, a "
            f"row filter or column list changed, a partition attached or detached, columns "
            f"renamed or retyped): {shown}. Nothing was committed. Fix: run the snapshot again"
        )


class ArrowPeekError(PgLogReplError):
    """The ADBC fetch of a window failed (or ADBC is missing): the drain decodes that window
    through psycopg and the reference decoder instead, which names the cause if it fails too."""

    retryable = True
