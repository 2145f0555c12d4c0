"""The project's error tree: every failure names the object involved and the fix.

Callers catch the specific class (``SlotNotFoundError``, ``SlotInUseError`` ...), never a bare
``Exception``. Nothing here imports Airflow or psycopg, so the pure parts of the package (the LSN
type, the decoder) can raise these inside Spark executors too.

Each class says whether running the task again unchanged can succeed (``retryable``). Most cannot:
a lost slot, a missing grant or a lake from another server wait for a person. The task boundary
(``airflow_pglogrepl.boundary``) is the one place that turns those into Airflow's
``AirflowFailException``, so a task fails at once instead of spending its retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.preflight.report import PreflightReport
    from airflow_pglogrepl.tables import TableRef


class PgLogReplError(Exception):
    """Base class of every error raised by airflow-pglogrepl."""

    # Whether the same task, run again unchanged, can succeed (the condition passes by itself:
    # a busy slot, a lock, a network fault). False: a person must act first.
    retryable: bool = False


class InvalidLSNError(PgLogReplError, ValueError):
    """Text or a number that is not a valid PostgreSQL LSN (``pg_lsn``)."""

    def __init__(self, text: object, reason: str = "") -> None:
        self.text = text
        detail = f": {reason}" if reason else ""
        super().__init__(
            f"invalid LSN {text!r}{detail}; expected two hexadecimal halves of at most "
            f"8 digits each, as PostgreSQL prints them (for example '16/B374D848')"
        )


class ConnectionFailedError(PgLogReplError):
    """A PostgreSQL server could not be reached or refused the login.

    The message carries the server's reason with any password removed; it never includes the DSN.
    """

    retryable = True


class ServerNotConfiguredError(PgLogReplError):
    """The server lacks a setting that logical replication needs (``wal_level`` and friends)."""

    def __init__(
        self, setting: str, current: str, required: str, fix: str, *, server: str | None = None
    ) -> None:
        self.setting = setting
        self.current = current
        self.required = required
        self.server = server
        which = f"the server {server}" if server else "the server"
        super().__init__(
            f"{which} is not configured for logical replication: {setting} is "
            f"{current!r}, it must be {required}. Fix: {fix}"
        )


class PublisherNotConfiguredError(ServerNotConfiguredError):
    """The publisher refused what a subscription statement asked of it (its replication slot, a
    WAL sender) for want of a setting. Raised on the subscriber's side; the publisher's own text,
    as the subscriber relayed it, is the cause (``__cause__``)."""

    def __init__(
        self, setting: str, required: str, publisher: str, refused: str, fix: str,
        *, retryable: bool = False,
    ) -> None:  # fmt: skip
        self.setting = setting
        self.current = "unknown"
        self.required = required
        self.publisher = publisher
        self.retryable = retryable
        PgLogReplError.__init__(
            self,
            f"the publisher {publisher} refused {refused}: {setting} must be {required} there. "
            f"Fix: {fix}",
        )


class SlotError(PgLogReplError):
    """Something is wrong with a named replication slot."""

    def __init__(self, slot: str, message: str) -> None:
        self.slot = slot
        super().__init__(message)


class InvalidSlotNameError(SlotError, ValueError):
    """A slot name PostgreSQL would reject; caught before anything is sent to the server."""

    def __init__(self, slot: str) -> None:
        super().__init__(
            slot,
            f"invalid replication slot name {slot!r}: PostgreSQL allows only lower-case letters, "
            f"digits and '_' (1 to 63 characters). Fix: choose a name such as "
            f"'airflow_drain_orders'",
        )


class SlotNotFoundError(SlotError):
    """The slot does not exist on this server (or in this database)."""

    def __init__(self, slot: str, database: str | None = None) -> None:
        where = f" on database {database!r}" if database else ""
        super().__init__(
            slot,
            f"replication slot {slot!r} does not exist{where}. Fix: create it (for example with "
            f"CreateReplicationSlotOperator or pg_create_logical_replication_slot) or correct "
            f"the slot name",
        )


class SlotAlreadyExistsError(SlotError):
    """Creating a slot whose name is taken."""

    def __init__(self, slot: str) -> None:
        super().__init__(
            slot,
            f"replication slot {slot!r} already exists. Fix: reuse it, drop it first if it is "
            f"abandoned (it retains WAL until dropped), or choose another name",
        )


class SlotInUseError(SlotError):
    """Another session is streaming from (or advancing) the slot right now."""

    retryable = True

    def __init__(self, slot: str, active_pid: int | None = None) -> None:
        self.active_pid = active_pid
        who = f"backend PID {active_pid}" if active_pid else "another session"
        super().__init__(
            slot,
            f"replication slot {slot!r} is active in {who}; a slot has one consumer at a time. "
            f"Fix: stop that consumer (see pg_stat_replication / pg_stat_activity for the PID) "
            f"or use a different slot",
        )


class WrongPluginError(SlotError):
    """The slot was created with an output plugin other than the one this task decodes."""

    def __init__(self, slot: str, plugin: str | None, expected: str) -> None:
        self.plugin = plugin
        self.expected = expected
        super().__init__(
            slot,
            f"replication slot {slot!r} uses output plugin {plugin!r}, this task needs "
            f"{expected!r}. Fix: create a separate slot with plugin {expected!r}; a slot's "
            f"plugin cannot be changed",
        )


class SlotLostError(SlotError):
    """The slot was invalidated (``wal_status = lost``): nothing can be decoded from it.

    ``reason`` is the server's ``invalidation_reason`` (PostgreSQL 17+), ``None`` before."""

    def __init__(self, slot: str, reason: str | None = None) -> None:
        self.reason = reason
        super().__init__(slot, lost_slot_message(slot, reason, "nothing can be drained from it"))


# pg_replication_slots.invalidation_reason (17+): why, and what keeps it from happening again.
INVALIDATION_CAUSES: dict[str, tuple[str, str]] = {
    "wal_removed": (
        "the WAL it needed was removed",
        "raise max_slot_wal_keep_size (or -1) or consume the slot more often",
    ),
    "rows_removed": (
        "catalog rows it needed were removed by VACUUM on the primary (a slot on a standby)",
        "turn on hot_standby_feedback with a physical slot between standby and primary",
    ),
    "wal_level_insufficient": (
        "wal_level was lowered below logical on the primary",
        "keep wal_level = logical",
    ),
    "idle_timeout": (
        "it was inactive longer than idle_replication_slot_timeout (PostgreSQL 18)",
        "raise idle_replication_slot_timeout (0 turns it off) or consume the slot more often",
    ),
}


def lost_slot_message(slot: str, reason: str | None, consequence: str) -> str:
    """Why a slot is lost and what to do, in the server's own terms where it says them."""
    if reason in INVALIDATION_CAUSES:
        cause, prevent = INVALIDATION_CAUSES[reason]
        why = f"invalidated ({reason}): {cause}"
    elif reason:
        why, prevent = f"invalidated ({reason})", "see the server log for the invalidation"
    else:
        why = "lost (wal_status = lost): the WAL it needed was removed"
        prevent = "raise max_slot_wal_keep_size (or -1) or consume the slot more often"
    return (
        f"replication slot {slot!r} is {why}, so {consequence}. It can never be used again. "
        f"Fix: drop it and start again (for a subscription: recreate it with copy_data; for a "
        f"drain: a new initial snapshot); to keep it from happening again, {prevent}"
    )


class SlotAdvanceError(SlotError):
    """A slot could not be moved to the requested LSN (for example, behind its current position)."""


class DecodeError(PgLogReplError):
    """A logical decoding message could not be decoded (truncated, corrupt, or out of context).

    ``message_type`` is the protocol byte as a character (``'I'``, ``'U'`` ...) or the
    test_decoding line kind; ``offset`` is the byte (or character) offset where decoding stopped.
    """

    def __init__(self, message_type: str, offset: int, reason: str) -> None:
        self.message_type = message_type
        self.offset = offset
        self.reason = reason
        super().__init__(f"cannot decode {message_type!r} message at offset {offset}: {reason}")


class UnknownRelationError(DecodeError):
    """A data message refers to a relation OID no Relation message has described yet."""

    def __init__(self, message_type: str, offset: int, relation_id: int) -> None:
        self.relation_id = relation_id
        super().__init__(
            message_type,
            offset,
            f"relation OID {relation_id} has not been described by a Relation message; decoding "
            f"must start at a transaction boundary of the slot (its confirmed_flush_lsn), where "
            f"pgoutput resends Relation messages",
        )


class DefinitionConflictError(PgLogReplError):
    """An object exists with a definition this task cannot reconcile without destroying it."""

    def __init__(self, kind: str, name: str, difference: str, fix: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} exists but {difference}. Fix: {fix}")


class ObjectNotFoundError(PgLogReplError):
    """A publication or subscription that the task needs does not exist."""

    def __init__(self, kind: str, name: str, fix: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} does not exist. Fix: {fix}")


_LISTED = 20  # existing publications a PublicationNotFoundError names


class PublicationNotFoundError(ObjectNotFoundError):
    """Publications a drain, a snapshot or a peek reads do not exist (in the slot's database).

    ``existing``: the publications that database has, when looked up; the message lists them
    and suggests the closest to each missing name. ``server``: where it was looked (host, port,
    database). ``consequence``: what was (not) done; by default, nothing committed and the slot
    not moved, and on PostgreSQL 18 (``server_version``) why that matters."""

    def __init__(
        self,
        names: Sequence[str],
        slot: str | None = None,
        *,
        existing: Sequence[str] | None = None,
        server: str | None = None,
        server_version: int | None = None,
        consequence: str | None = None,
    ) -> None:
        import difflib

        self.kind = "publication"
        self.name = ", ".join(names)
        self.names = list(names)
        self.existing = None if existing is None else list(existing)
        self.slot = slot
        shown = ", ".join(repr(n) for n in names)
        what = (
            f"publication {shown} does not" if len(names) == 1 else f"publications {shown} do not"
        )
        if server:
            where = f" on {server}"
        elif slot:
            where = f" in the database of slot {slot!r}"
        else:
            where = ""
        found = ""
        if existing is not None:
            # a few: a database of one publication per tenant would fill every alert
            listed = ", ".join(repr(e) for e in existing[:_LISTED]) if existing else "none"
            if len(existing) > _LISTED:
                listed += f" and {len(existing) - _LISTED} more"
            found = f". The publications there: {listed}"
            guesses = [
                f"{close[0]!r} for {name!r}" if len(names) > 1 else repr(close[0])
                for name in names
                if (close := difflib.get_close_matches(name, existing, n=1, cutoff=0.6))
            ]
            if guesses:
                found += f"; did you mean {', '.join(guesses)}?"
        if consequence is None:
            consequence = "Nothing was committed and the slot did not move"
            if server_version is not None and server_version >= 180000:
                consequence += (
                    ": on PostgreSQL 18 a missing publication is only a warning, and every "
                    "window would come back empty while the slot advanced past the changes"
                )
        head = f"{what} exist{where}{found}"
        PgLogReplError.__init__(
            self,
            f"{head}{'' if head.endswith('?') else '.'} Fix: correct the publication name, or "
            f"create it there (CREATE PUBLICATION, or CreatePublicationOperator). {consequence}",
        )


class UnsupportedFeatureError(PgLogReplError):
    """The server version lacks a feature the task asks for."""


class ReplicationFailedError(PgLogReplError):
    """Replication is failing (table sync or apply errors) and will not heal by waiting."""


class GateFailedError(ReplicationFailedError):
    """A sensor's gate saw a state no wait can fix (a lost slot, a disabled subscription, a table
    whose sync failed); the message is the verdict's, with the object and the fix.
    ``retryable``: the check itself failed (a deferred sensor's trigger lost its connection)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        self.retryable = retryable
        super().__init__(message)


class CheckFailedError(PgLogReplError):
    """A check task found problems; ``problems`` lists them, one line each, as the message does.

    The task's report (what was looked at, what differed) is in its XCom ``return_value``."""

    def __init__(self, heading: str, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(heading + ":\n- " + "\n- ".join(self.problems))


class SlotUnhealthyError(CheckFailedError):
    """A slot retains too much WAL, is lost or inactive too long, or cannot decode its
    transactions within ``temp_file_limit`` (``SlotHealthCheckOperator``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("slot health check failed", problems)


class SubscriptionErrorsError(CheckFailedError):
    """A subscription has apply or sync errors, conflicts above their limit, or no running
    worker (``SubscriptionErrorCheckOperator``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("subscription errors", problems)


class ParityMismatchError(CheckFailedError):
    """Tables whose rows differ between publisher and subscriber (``TableParityCheckOperator``)."""

    def __init__(self, checked: int, problems: Sequence[str]) -> None:
        super().__init__(f"parity check failed for {len(problems)} of {checked} tables", problems)


class SequenceSyncError(CheckFailedError):
    """Sequences the sync could not set (``SyncSequencesOperator``); ``refused`` when it changed
    nothing because of them."""

    def __init__(self, problems: Sequence[str], *, refused: bool = False) -> None:
        heading = "refused, nothing was changed" if refused else "failed"
        super().__init__(f"sequence sync {heading}", problems)


class CutoverNotSwitchedError(PgLogReplError):
    """The cutover ended without switching writers to the new primary (``CutoverSummaryOperator``
    with ``fail_unless_switched``); the summary says where it stopped and what to do next."""

    def __init__(self, outcome: str, next_step: str) -> None:
        self.outcome = outcome
        super().__init__(f"the cutover did not switch: {outcome}. Next: {next_step}")


class PrivilegeError(PgLogReplError):
    """The connection's role lacks a privilege a step needs; nothing of the step was done."""

    def __init__(self, role: str, what: str, fix: str) -> None:
        self.role = role
        super().__init__(f"role {role!r} may not {what}. Nothing was done. Fix: {fix}")


class PasswordExposureError(PgLogReplError):
    """A statement carrying a password would be written to the server's log or statistics."""

    def __init__(self, kind: str, name: str, role: str, leaks: list[str]) -> None:
        self.leaks = leaks
        super().__init__(
            f"{kind} {name!r}: the statement carries the publisher's password, and as role "
            f"{role!r} this session cannot keep it out of the subscriber's server log and "
            f"statistics: {'; '.join(leaks)}. Nothing was sent. Fix: connect as a superuser, "
            f"or let the role set these parameters (PostgreSQL 15+: GRANT SET ON PARAMETER "
            f"<name> TO {role}), or change them for the server, or (superuser-owned "
            f"subscriptions only) leave the password out of the publisher connection and "
            f"put it in the subscriber server's passfile"
        )


class FenceNotHeldError(PgLogReplError):
    """The write fence would not stop every write: nothing was changed (the fence rolled back)."""


class FenceLockBusyError(FenceNotHeldError):
    """A lock on a fenced table kept the fence's guard from being changed within its wait;
    nothing was changed, and the same task run again can pass once that lock is gone."""

    retryable = True


class GuardHijackedError(FenceNotHeldError):
    """The write guard's schema belongs to a role the fencing role does not trust."""


class LakeError(PgLogReplError):
    """The lake cannot be written as asked; the message names the table or path and the fix."""


class LakeLocationError(LakeError, ValueError):
    """A lake URI (``sink``) or its store's connection that cannot be used as given: nothing
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


class SinkError(LakeError):
    """The lake (the sink) and the slot or snapshot disagree about what it holds: draining on
    would lose or double changes, so nothing is drained or committed."""


class SinkNotEmptyError(SinkError):
    """An initial snapshot was asked for a lake that already holds data."""


class SinkNotSnapshottedError(SinkError):
    """A re-snapshot of some tables was asked for a lake no initial snapshot committed to."""


class SnapshotNotCommittedError(SinkError):
    """A snapshot or drain application ended without reporting its commit: nothing of it may be
    taken as in the lake, and the slot must not move."""

    retryable = True


class SlotAheadOfSinkError(SinkError):
    """The slot confirmed changes the lake never committed: they are lost to this lake."""

    def __init__(self, slot: str, slot_lsn: LSN, sink_lsn: LSN, sink: str) -> None:
        self.slot_lsn = slot_lsn
        self.sink_lsn = sink_lsn
        super().__init__(
            f"replication slot {slot!r} is at confirmed_flush_lsn {slot_lsn}, ahead of the "
            f"sink {sink} (last committed window ends at {sink_lsn}): the changes between "
            f"{sink_lsn} and {slot_lsn} were consumed by someone else and are not in the lake. "
            f"Nothing was drained. Fix: find what advanced the slot; rebuild the sink from a new "
            f"initial snapshot, or accept the gap explicitly by recording it"
        )


class SinkFromAnotherSourceError(SinkError):
    """The lake's commits came from another server, or another timeline of this one: its LSNs
    and the slot's do not describe the same WAL, so neither can move the other."""

    def __init__(
        self, slot: str, sink: str, recorded: dict[str, Any], current: dict[str, Any]
    ) -> None:
        def show(identity: dict[str, Any]) -> str:
            return (
                f"system identifier {identity.get('system_identifier')}, timeline "
                f"{identity.get('timeline')}, database {identity.get('database')!r}"
            )

        super().__init__(
            f"lake {sink} was written from {show(recorded)}, but slot {slot!r} is on "
            f"{show(current)}. Nothing was drained and the slot did not move. Fix: point the "
            f"drain at the server the lake came from (PGLOGREPL_SOURCE_DSN, or the connection). "
            f"If the change was deliberate and the lake's history is this server's (a pg_upgrade "
            f"that carried the slot over, or a promotion whose slot was synced before the "
            f"switch), drain once with accept_source_change=True (--accept-source-change); "
            f"otherwise take a new initial snapshot into a new lake"
        )


class SparkSetupError(PgLogReplError):
    """The Spark application cannot run where it was sent (executors without the package...)."""


class SparkApplicationError(PgLogReplError):
    """A Spark application of this package (the drain, the snapshot) failed with ``error``, one of
    the errors here or a foreign one: the operator raises it again on its side of spark-submit,
    retryable as the original is (a foreign error is taken as retryable: a crash, a lost executor).
    """

    def __init__(self, error: str, message: str, *, retryable: bool) -> None:
        self.error = error
        self.retryable = retryable
        super().__init__(f"the Spark application failed with {error}: {message}")


class SubscriptionStatementError(PgLogReplError):
    """A statement on a subscription failed; the message has the server's error, without the
    publisher's password. ``retryable`` when the cause passes by itself (the publisher
    unreachable or out of WAL senders, a lock, a lost session)."""


class PreflightFailedError(PgLogReplError):
    """Something blocks replication; the message is the report's summary (every problem)."""

    def __init__(
        self, report: PreflightReport, *, warnings_fail: bool = False, retryable: bool = False
    ) -> None:
        self.report = report
        # True when every problem is on a table whose fix only a lock held up
        self.retryable = retryable
        lead = "" if report.problems or not warnings_fail else "Warnings fail this check "
        lead = lead and lead + "(fail_on_warnings=True).\n"
        super().__init__(lead + report.summary())


class ReplicaIdentityChangeError(PgLogReplError):
    """``ALTER TABLE ... REPLICA IDENTITY`` was refused (ownership, lock timeout, bad index)."""

    def __init__(self, table: TableRef, statement: str, reason: str, fix: str) -> None:
        self.table = table
        self.statement = statement
        self.reason = reason
        self.fix = fix
        super().__init__(f"{statement} failed: {reason}. Fix: {fix}")


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


class SchemaChangedError(LakeError):
    """A table changed in a way the lake cannot follow by itself; a re-snapshot of it can."""

    def __init__(self, table: str, what: str) -> None:
        self.table = table
        self.what = what  # the table's own problem, without the drain's (a quarantine's record)
        super().__init__(
            f"table {table}: {what}. Nothing of this window was committed and the slot did not "
            f"move. Fix: re-snapshot the table (InitialSnapshotOperator(tables=[{table!r}], ...) "
            f"or snapshot_app --tables): its state is copied again and its changelog goes on with "
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
            f"(InitialSnapshotOperator(tables={names!r}, ...) or snapshot_app --tables): the "
            f"snapshot holds every quarantined change, and the drain goes on with the table"
        )


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


class LakeCommitConflictError(SinkError):
    """A lake commit was refused because the table's log does not hold what this run read
    before writing: another writer committed in between, or the commit would move the table's
    transaction version backwards. Nothing of the commit was made."""

    retryable = True

    def __init__(self, table: str, app: str, expected: int | None, found: int | None,
                 version: int) -> None:  # fmt: skip
        from airflow_pglogrepl.lsn import LSN

        def show(value: int | None) -> str:
            return "none" if value is None else str(LSN(value))

        self.table = table
        if found is not None and found >= version and found == expected:
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


class LakeOfAnotherSlotError(SinkError):
    """The lake belongs to another slot: draining or snapshotting a second slot into it would
    replay one slot's changes onto the other's state."""

    def __init__(self, sink: str, recorded: dict[str, Any], slot: str) -> None:
        super().__init__(
            f"lake {sink} belongs to slot {recorded.get('slot')!r} (database "
            f"{recorded.get('database')!r}, publications {recorded.get('publications')}, "
            f"begun {recorded.get('created_at')}), not to slot {slot!r}. Nothing was written. "
            f"Fix: give each slot a lake of its own (a new sink path for {slot!r}); if the lake "
            f"should now follow {slot!r} instead, take a new initial snapshot into a new lake"
        )


class LakeSnapshotUnfinishedError(SinkError):
    """The lake was begun by an initial snapshot that never committed: a drain would start at
    the slot and leave every table the snapshot did not reach without its rows."""

    def __init__(self, sink: str, slot: str, began: str | None, points: Sequence[str]) -> None:
        left = f" (state staged at {', '.join(points)})" if points else ""
        super().__init__(
            f"lake {sink} was begun by an initial snapshot of slot {slot!r} at {began} that "
            f"never committed{left}: draining now would leave the tables it did not reach "
            f"empty. Nothing was drained and the slot did not move. Fix: run the initial "
            f"snapshot again (InitialSnapshotOperator, or snapshot_app with --replace-slot when "
            f"the killed run left its slot), then drain"
        )
