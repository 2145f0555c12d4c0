"""Errors of the lake: its location and store, its tables and their schemas, its writers and
its position against the slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_pglogrepl.lsn import LSN

from airflow_pglogrepl.exceptions.base import PgLogReplError


class LakeError(PgLogReplError):
    """The lake cannot be written as asked; the message names the table or path and the fix."""


class LakeLocationError(LakeError, ValueError):
    """A lake URI (``lake``) or its store's connection that cannot be used as given: nothing
    was started. The message never repeats the URI or a connection's value (either may hold a
    secret); it names the part that is wrong and the fix."""


class LakeStoreUnreachableError(LakeError):
    """The lake's object store did not answer, or refused the lake's credentials, when the
    task looked before starting anything: a network fault may pass, so the task is retried."""

    retryable = True


class ReplayRangeError(LakeError):
    """A replay (``lake.replay``) asked for a table's changes or state where the lake cannot
    give them exactly: past its position, before its beginning, over the changes a re-snapshot
    took into the state, or at a position the table's state was not merged at. Nothing is
    returned rather than an incomplete answer; the message says what the lake can give."""

    def __init__(self, table: str, asked: str, why: str, available: str, fix: str) -> None:
        self.table = table
        self.asked = asked
        self.available = available
        super().__init__(f"{asked} of {table}: {why}. The lake can give {available}. Fix: {fix}")


class TableNotInLakeError(LakeError):
    """A replay named a table the lake has neither a changelog nor a state of."""

    def __init__(self, table: str, root: str, known: Sequence[str]) -> None:
        self.table = table
        shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
        super().__init__(
            f"lake {root} has no table {table} (no changes/ and no state/ table of it); it "
            f"holds: {shown or 'no tables'}. Fix: name the table as the lake does (schema.table, "
            f"or a TableRef for names with dots or quotes), or check the publication"
        )


class LakeMismatchError(LakeError):
    """The lake and the slot or snapshot disagree about what it holds: draining on
    would lose or double changes, so nothing is drained or committed."""


class LakeNotEmptyError(LakeMismatchError):
    """An initial snapshot was asked for a lake that already holds data."""


class LakeNotSnapshottedError(LakeMismatchError):
    """A re-snapshot of some tables was asked for a lake no initial snapshot committed to."""


class SnapshotNotCommittedError(LakeMismatchError):
    """A snapshot or drain application ended without reporting its commit: nothing of it may be
    taken as in the lake, and the slot must not move."""

    retryable = True


class SlotAheadOfLakeError(LakeMismatchError):
    """The slot confirmed changes the lake never committed: they are lost to this lake."""

    def __init__(self, slot: str, slot_lsn: LSN, lake_lsn: LSN, lake_root: str) -> None:
        self.slot_lsn = slot_lsn
        self.lake_lsn = lake_lsn
        super().__init__(
            f"replication slot {slot!r} is at confirmed_flush_lsn {slot_lsn}, ahead of the "
            f"lake {lake_root} (last committed window ends at {lake_lsn}): the changes between "
            f"{lake_lsn} and {slot_lsn} were consumed by someone else and are not in the lake. "
            f"Nothing was drained. Fix: find what advanced the slot; rebuild the lake from a new "
            f"initial snapshot, or accept the gap explicitly by recording it"
        )


class LakePastFailoverError(LakeMismatchError):
    """The source was promoted from a standby that never received all the lake holds: the
    lake's changes past the switch point are not in the new primary's history, and its own
    commits take those LSNs, so draining on would mix two histories or skip new changes."""

    def __init__(self, slot: str, lake_root: str, position: object, timeline: object,
                 switch: object, current: object, *,
                 held_by: str | None = None) -> None:  # fmt: skip
        what = f"lake {lake_root} holds"
        if held_by:
            what = f"table {held_by} of lake {lake_root} holds"
        super().__init__(
            f"{what} the WAL up to {position} on timeline {timeline}, "
            f"but the server of slot {slot!r} left timeline {timeline} at {switch} (a promotion; "
            f"it is on timeline {current}): what the lake holds past {switch} never reached the "
            f"standby that was promoted. Nothing was drained and the slot did not move. Fix: take "
            f"a new initial snapshot into a new lake. To keep this from happening again, list the "
            f"standby's physical slot in synchronized_standby_slots on the primary, so no "
            f"consumer confirms past what the standby has (docs/high-availability.md)"
        )


class LakeFromAnotherSourceError(LakeMismatchError):
    """The lake's commits came from another server, or another timeline of this one: its LSNs
    and the slot's do not describe the same WAL, so neither can move the other."""

    def __init__(
        self, slot: str, lake_root: str, recorded: dict[str, Any], current: dict[str, Any]
    ) -> None:
        def show(identity: dict[str, Any]) -> str:
            version = identity.get("server_version_num")
            major = f" (PostgreSQL {version // 10000})" if isinstance(version, int) else ""
            return (
                f"system identifier {identity.get('system_identifier')}{major}, timeline "
                f"{identity.get('timeline')}, database {identity.get('database')!r}"
            )

        super().__init__(
            f"lake {lake_root} was written from {show(recorded)}, but slot {slot!r} is on "
            f"{show(current)}. Nothing was drained and the slot did not move. Fix: point the "
            f"drain at the server the lake came from (PGLOGREPL_SOURCE_DSN, or the connection). "
            f"A promotion of the lake's own server is recognised without this (its timeline "
            f"history); another timeline of the same system is another branch of its history. "
            f"If the change was deliberate and the lake's history is this server's (a pg_upgrade "
            f"that carried the slot over), drain once with accept_source_change=True "
            f"(--accept-source-change); otherwise take a new initial snapshot into a new lake"
        )


class SchemaChangedError(LakeError):
    """A table changed in a way the lake cannot follow by itself; a re-snapshot of it can."""

    def __init__(self, table: str, what: str) -> None:
        self.table = table
        self.what = what  # the table's own problem, without the drain's (a quarantine's record)
        super().__init__(
            f"table {table}: {what}. Nothing of this window was committed and the slot did not "
            f"move. Fix: re-snapshot the table (InitialSnapshotOperator(tables=[{table!r}], ...) "
            f"or snapshot_app --table): its state is copied again and its changelog goes on with "
            f"the new columns, then run the drain again"
        )


class IncompatibleSchemaChangeError(SchemaChangedError):
    """A column changed its lake type, or the table its key or replica identity."""

    def __init__(self, table: str, what: str) -> None:
        super().__init__(table, f"{what}, which rows already in the lake cannot take")


class ColumnBackfillError(SchemaChangedError):
    """A column was added with values in existing rows that no change and no catalog reveal."""

    def __init__(self, table: str, column: str) -> None:
        self.column = column
        super().__init__(
            table,
            f"column {column!r} was added with a default PostgreSQL computed row by row (a "
            f"volatile default such as clock_timestamp() or gen_random_uuid(), which rewrites the "
            f"table), or the table was rewritten since (VACUUM FULL, CLUSTER): the rows that "
            f"existed then hold values no change carried, and the lake cannot know them",
        )


class UnsupportedColumnTypeError(LakeError):
    """Columns whose lake type Delta Lake cannot store: a type the lake maps wrongly (a bug)."""

    def __init__(self, table: str, columns: dict[str, str]) -> None:
        self.table = table
        self.columns = columns
        shown = ", ".join(f"{name} ({kind})" for name, kind in columns.items())
        self.what = f"columns Delta Lake cannot store as typed: {shown}"
        super().__init__(
            f"table {table} has columns Delta Lake cannot store as typed: {shown}. Nothing of "
            f"this window was committed and the slot did not move. Every PostgreSQL type should "
            f"have a lake type (docs/types.md): please report this with the columns' types"
        )


class UnstorableValueError(LakeError):
    """A value of a supported type that its lake type cannot hold (a timestamp after 294247)."""

    def __init__(self, table: str, column: str, value: object, reason: str) -> None:
        self.table = table
        self.column = column
        self.what = (
            f"column {column!r}: the value {value!r} cannot be stored in the lake ({reason})"
        )
        super().__init__(
            f"table {table}, column {column!r}: the value {value!r} cannot be stored in the "
            f"lake ({reason}). Nothing of it was committed and the slot did not move. "
            f"Fix: correct the row on the publisher, then re-snapshot the table "
            f"(InitialSnapshotOperator(tables=[{table!r}], ...)) and run the drain again: it "
            f"skips the table's changes the snapshot already holds, this one included"
        )


class QuarantinedTablesError(LakeError):
    """Tables whose changes the lake could not store went to its quarantine
    (``lake.quarantine``); every other table was committed and the slot moved on."""

    def __init__(self, lake: str, tables: dict[str, dict[str, str]]) -> None:
        self.lake = lake
        self.tables = tables
        shown = "; ".join(
            f"{table}: {held['error']}: {held['what']} (since {held['since']})"
            for table, held in sorted(tables.items())
        )
        names = sorted(tables)
        super().__init__(
            f"{len(tables)} table(s) of lake {lake} are in quarantine, their changes kept in "
            f"{lake}/_pglogrepl/quarantine while every other table goes on: {shown}. Fix: "
            f"correct the cause (a value on the publisher, or the column), then re-snapshot "
            f"(InitialSnapshotOperator(tables={names!r}, ...) or snapshot_app --table): the "
            f"snapshot holds every quarantined change, and the drain goes on with the table"
        )


class LakeIncompleteError(LakeError):
    """Published tables whose state the WAL could not keep equal to the source: a table added
    to the publication holding rows, a partition attached holding rows, or one detached or
    dropped (``pipeline.coverage``). Every change was committed and the slot moved on; the
    tables are named with the fix until they are re-snapshotted or the difference accepted."""

    def __init__(self, lake: str, tables: dict[str, dict[str, str]]) -> None:
        self.lake = lake
        self.tables = tables
        shown = "; ".join(
            f"{table}: {gap['what']} (since {gap['since']})"
            + (f"; {gap['repair']}" if gap.get("repair") else "")
            + f". Fix: {gap['fix']}"
            for table, gap in sorted(tables.items())
        )
        super().__init__(
            f"{len(tables)} table(s) of lake {lake} may differ from their source, which the "
            f"WAL cannot repair: {shown}"
        )


class LakeDriftError(LakeError):
    """A parity check found tables whose state differs from their source at the same
    position (``spark.state_parity``): the keys missing from the lake, extra in it, with
    other values, or held by more than one row, counted and the first of each named."""

    def __init__(self, lake: str, tables: dict[str, dict[str, object]]) -> None:
        self.lake = lake
        self.tables = tables
        shown = "; ".join(f"{table}: {_found(found)}" for table, found in sorted(tables.items()))
        super().__init__(
            f"{len(tables)} table(s) of lake {lake} differ from their source: {shown}. Fix: "
            f"resync them (SlotDrainOperator(resync=[...]) or drain_app --resync TABLE), or "
            f"run the check with repair (parity_repair=True, drain_app --parity-repair)"
        )


def _found(found: dict[str, object]) -> str:
    said = (
        f"{found.get('missing_rows', 0)} row(s) missing from the lake, "
        f"{found.get('extra_rows', 0)} extra, {found.get('different_rows', 0)} different"
    )
    if found.get("duplicate_rows"):
        said += f", {found['duplicate_rows']} key(s) held by more than one row"
    said += f" (first keys: {_first_keys(found)})"
    if found.get("columns_missing"):
        said += f", columns missing from the lake: {found['columns_missing']}"
    return said


def _first_keys(found: dict[str, object]) -> str:
    keys: list[object] = []
    for kind in ("missing", "extra", "different", "duplicate"):
        shown = found.get(f"{kind}_keys")
        if isinstance(shown, list):
            keys.extend(shown[:3])
    return ", ".join(map(str, keys[:5])) or "none"


class LakeWriterBusyError(LakeError):
    """Another run holds the writer lock of this slot's lake (a drain or a snapshot)."""

    retryable = True

    def __init__(self, slot: str, holder: dict[str, object] | None) -> None:
        self.slot = slot
        self.holder = holder
        if holder:
            who = (
                f"backend pid {holder.get('pid')} (application {holder.get('application_name')!r}"
                f", client {holder.get('client_addr') or 'local socket'}, connected since "
                f"{holder.get('backend_start')})"
            )
            fix = (
                f"wait for that run to finish; if its process is gone, end the session with "
                f"SELECT pg_terminate_backend({holder.get('pid')})"
            )
        else:
            who = "another session (not visible to this role)"
            fix = "wait for the other run to finish"
        super().__init__(
            f"the lake of slot {slot!r} is being written by {who}: only one drain or snapshot "
            f"may write it at a time. Nothing was done. Fix: {fix}"
        )


class WriterLockLostError(LakeError):
    """The run no longer holds its lake's writer lock (its session ended, or the lock is gone):
    another run may be writing. Found before a commit or a slot advance, which did not happen."""

    retryable = True

    def __init__(self, slot: str, reason: str) -> None:
        self.slot = slot
        super().__init__(
            f"the writer lock of the lake of slot {slot!r} is no longer held by this run "
            f"({reason}); another drain or snapshot may be writing the lake now. This run "
            f"stopped before its next commit: nothing more was committed, and the slot was not "
            f"moved past what the lake holds. Fix: nothing needs repair; run again (the next run "
            f"starts from the lake's position). If it recurs, find what ends the lock's session: "
            f"a connection pooler in transaction mode (connect the drain directly), a firewall "
            f"dropping idle connections, pg_terminate_backend, or a publisher restart"
        )


class UnsafeRetentionError(LakeError):
    """A lake upkeep was asked to VACUUM with a retention shorter than a table allows: files a
    running reader's snapshot may still read would be removed. Refused before anything is done."""

    def __init__(self, table: str, asked_hours: float, floor_hours: float, why: str) -> None:
        self.table = table
        self.asked_hours = asked_hours
        self.floor_hours = floor_hours
        super().__init__(
            f"refusing to VACUUM {table} keeping removed files for {asked_hours:g} hours: {why} "
            f"requires at least {floor_hours:g} hours, and a shorter retention can delete files "
            f"that a reader which started before the removal still reads. Nothing was done. "
            f"Fix: keep at least {floor_hours:g} hours (keep_hours), or, if no reader of the "
            f"lake runs that long, lower min_retention_hours (or the table's "
            f"delta.deletedFileRetentionDuration) on purpose"
        )


class LakeCommitConflictError(LakeMismatchError):
    """A lake commit was refused because the table's log does not hold what this run read
    before writing: another writer committed in between, or the commit would move the table's
    transaction version backwards. Nothing of the commit was made."""

    retryable = True

    def __init__(self, table: str, app: str, expected: int | None, found: int | None,
                 version: int, *, log_version: int | None = None) -> None:  # fmt: skip
        from airflow_pglogrepl.lsn import LSN

        def show(value: int | None) -> str:
            return "none" if value is None else str(LSN(value))

        self.table = table
        if log_version is not None:  # the log entry this commit was to create was there
            what = (
                f"another writer committed version {log_version} of its log first (the "
                f"object store refused to create it again)"
            )
        elif found is not None and found >= version and found == expected:
            what = (
                f"its transaction version for {app!r} is already {show(found)}, and this "
                f"commit's ({show(version)}) is not above it: versions only go forward"
            )
        else:
            what = (
                f"it holds {app!r} at {show(found)}, but this run wrote its rows against "
                f"{show(expected)}: another writer committed there since"
            )
        super().__init__(
            f"commit to {table} refused: {what}. Nothing of this commit was made and the slot "
            f"did not move. Fix: make sure one writer drains this lake (one DAG, "
            f"max_active_runs=1, no drain outside Airflow at the same time), then run again: "
            f"the next run starts from what the lake holds"
        )


class SnapshotTableExistsError(LakeCommitConflictError):
    """A snapshot's copy of a table was not published: a Delta table is at its place already,
    created or published by another writer first (the log's first entry is a create that fails
    where one exists). A retry would copy the table again and meet the same table, so none is
    made; the message says what to do."""

    retryable = False

    def __init__(self, table: str) -> None:
        self.table = table
        LakeError.__init__(
            self,
            f"the snapshot's copy of {table} was not published: a Delta table is there already "
            f"(another writer created or published it first). Nothing was published there. "
            f"Fix: if another snapshot of this lake is running, let it finish and drain; "
            f"otherwise move or remove that table (or give the snapshot an empty lake), then "
            f"snapshot again",
        )


class LakeOfAnotherSlotError(LakeMismatchError):
    """The lake belongs to another slot: draining or snapshotting a second slot into it would
    replay one slot's changes onto the other's state."""

    def __init__(self, lake_root: str, recorded: dict[str, Any], slot: str) -> None:
        super().__init__(
            f"lake {lake_root} belongs to slot {recorded.get('slot')!r} (database "
            f"{recorded.get('database')!r}, publications {recorded.get('publications')}, "
            f"begun {recorded.get('created_at')}), not to slot {slot!r}. Nothing was written. "
            f"Fix: give each slot a lake of its own (a new lake path for {slot!r}); if the lake "
            f"should now follow {slot!r} instead, take a new initial snapshot into a new lake"
        )


class LakeSnapshotUnfinishedError(LakeMismatchError):
    """The lake was begun by an initial snapshot that never committed: a drain would start at
    the slot and leave every table the snapshot did not reach without its rows."""

    def __init__(self, lake_root: str, slot: str, began: str | None, points: Sequence[str]) -> None:
        left = f" (state staged at {', '.join(points)})" if points else ""
        super().__init__(
            f"lake {lake_root} was begun by an initial snapshot of slot {slot!r} at {began} that "
            f"never committed{left}: draining now would leave the tables it did not reach "
            f"empty. Nothing was drained and the slot did not move. Fix: run the initial "
            f"snapshot again (InitialSnapshotOperator, or snapshot_app with --replace-slot when "
            f"the killed run left its slot), then drain"
        )


class MergeStalledError(LakeError):
    """A table's Spark merge made no progress for the stall bound: its job ran with no task of
    the application active and none of its own finishing (a driver short of heap waits so
    without end, holding the lake's writer lock). The merge was cancelled before it committed:
    the state is unchanged and the next run merges the same changes again."""

    retryable = True

    def __init__(self, table: str, seconds: float) -> None:
        self.table = table
        self.seconds = seconds
        super().__init__(
            f"the Spark merge of {table} made no progress for {seconds:.0f} s (a job running, no "
            f"task active, none finished) and was cancelled; its state is unchanged and the next "
            f"run merges the same changes again. Fix: give the driver more memory "
            f"(driver_memory), or drain smaller windows (max_window_bytes); merge_stall_seconds "
            f"sets the bound (0 turns the watch off)"
        )


class BucketLostError(LakeError):
    """A bucket read back fewer rows than were written to it: its files were removed while the
    split ran. Nothing was committed; the next run splits again."""

    retryable = True

    def __init__(self, folder: str, k: int, written: int, found: int, setting: str) -> None:
        super().__init__(
            f"bucket {k} of {folder} read back {found} of the {written} rows written to it: "
            f"its files were removed while the split ran (a cleaner of temporary files, or a "
            f"folder shared without working locks). Nothing was merged; the next run splits "
            f"again. Fix: set {setting} to a local folder no cleaner visits"
        )
