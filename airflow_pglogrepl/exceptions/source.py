"""Errors of the source: the connection, the server's settings, slots, and decoding its changes."""

from __future__ import annotations

from airflow_pglogrepl.exceptions.base import PgLogReplError
from airflow_pglogrepl.exceptions.objects import UnsupportedFeatureError


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


class SlotGoneUnderLakeError(SlotNotFoundError):
    """The drain's slot does not exist, but the lake holds changes drained from it: the slot was
    dropped, or the server was promoted from a standby that had no synchronized copy of it.
    The changes after the lake's position are in no slot, so a new slot of the same name cannot
    carry the lake on (the drain refuses one that starts past the lake)."""

    def __init__(self, slot: str, lake_root: str, position: object, *, timeline: object,
                 promoted: bool) -> None:  # fmt: skip
        self.lake_root = lake_root
        if promoted:
            why = (
                f"the server was promoted (it is on timeline {timeline}, later than the lake's) "
                f"from a standby that held no synchronized copy of the slot"
            )
        else:
            why = "it was dropped, or the drain's connection points at another server"
        SlotError.__init__(
            self,
            slot,
            f"replication slot {slot!r} does not exist, but lake {lake_root} holds changes "
            f"drained from it up to {position}: {why}. The changes committed after {position} "
            f"are in no slot; a new slot of the same name would start past them, and the drain "
            f"refuses it. Nothing was drained. Fix: take a new initial snapshot into a new "
            f"lake path (InitialSnapshotOperator; keep the old lake for its history). To keep "
            f"it from happening again: on PostgreSQL 17 or later, create the drain's slot as a "
            f"failover slot synchronized to the standby (SlotHealthCheckOperator with "
            f"standby_conn_ids says whether it is); before 17 a standby keeps no copy of a "
            f"logical slot (docs/high-availability.md)",
        )


class StandbyNotConfirmingError(SlotError):
    """The slot is a failover slot, and a standby ``synchronized_standby_slots`` names is not
    streaming: every read of the slot would wait for it, silently, holding the lake's lock."""

    retryable = True

    def __init__(self, slot: str, absent: list[str], *, committed: int = 0) -> None:
        self.absent = absent
        done = (f"The {committed} windows committed before stay; nothing more was drained"
                if committed else "Nothing was drained")  # fmt: skip
        super().__init__(
            slot,
            f"replication slot {slot!r} is a failover slot, and synchronized_standby_slots on "
            f"its server names {absent}, through which no standby streams now (or which do not "
            f"exist): every read of the slot would wait until they confirm (wait event "
            f"WaitForStandbyConfirmation). {done}. Fix: bring the standby back, so "
            f"it streams through its physical slot again; or, for as long as it is away, remove "
            f"the name from synchronized_standby_slots on the primary (a failover in that time "
            f"may then leave the lake past the promoted server: docs/high-availability.md)",
        )


class FailoverSlotUnsupportedError(SlotError, UnsupportedFeatureError):
    """A failover slot was asked for where the server cannot keep one: before PostgreSQL 17, on
    a standby, or for a temporary slot."""

    def __init__(self, slot: str, server: str, why: str, fix: str) -> None:
        super().__init__(
            slot, f"replication slot {slot!r} cannot be a failover slot on {server}: {why}. "
            f"Fix: {fix}",
        )  # fmt: skip


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


class SlotStreamError(SlotError):
    """The replication stream of a slot ended before the drain did: the walsender was
    terminated, the server restarted, the network dropped. What the lake committed was
    confirmed and stays; the next run streams again from the slot's confirmed position."""

    retryable = True

    def __init__(self, slot: str, server: str, reason: str) -> None:
        self.reason = reason
        super().__init__(
            slot,
            f"the replication stream of slot {slot!r} on {server} ended: {reason}. Every window "
            f"committed before it is in the lake and confirmed; nothing after it was. Fix: run "
            f"the task again (it resumes there); if it keeps ending, see the server's log for "
            f"the walsender's exit and wal_sender_timeout",
        )


class SlotStreamUnavailableError(SlotError):
    """The server refused a replication connection for the slot (the role lacks REPLICATION,
    every walsender is taken, pg_hba.conf rejects it): the drain can still peek the slot
    (``reader="peek"``, or ``"auto"``, which falls back by itself)."""

    def __init__(self, slot: str, reason: str) -> None:
        self.reason = reason
        super().__init__(
            slot,
            f"slot {slot!r} cannot be streamed: {reason}. Fix: ALTER ROLE <drain role> "
            f"REPLICATION, and a walsender free under max_wal_senders (pg_hba.conf matches a "
            f"logical replication connection by its database, not by the 'replication' "
            f"keyword); or drain with reader='peek' (or 'auto', which falls back to it)",
        )


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


class StreamProtocolError(DecodeError):
    """A frame the streaming replication protocol does not allow: the stream cannot be
    trusted past it, and nothing of the window it was in is committed."""

    def __init__(self, reason: str) -> None:
        super().__init__("CopyData", 0, reason)
