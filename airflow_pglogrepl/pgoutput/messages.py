"""pgoutput protocol messages: one immutable record per message, constants are the protocol bytes.

These mirror PostgreSQL's "Logical Replication Message Formats" field for field, so a test can
build a byte buffer, decode it and compare the whole record. They hold what the wire holds
(relation OIDs, raw tuple columns); turning them into per-table changes with column names and
Python values is ``per_message.PgOutputStream``'s job.
See https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
(the protocol-4 Stream Abort fields: https://www.postgresql.org/docs/16/protocol-logicalrep-message-formats.html)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Literal, TypeAlias

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import layouts

__all__ = [
    "UNCHANGED_TOAST",
    "BeginMessage",
    "BeginPrepareMessage",
    "Binary",
    "ColumnKind",
    "CommitMessage",
    "CommitPreparedMessage",
    "DeleteMessage",
    "InsertMessage",
    "LogicalDecodingMessage",
    "MessageType",
    "OriginMessage",
    "PgOutputMessage",
    "PrepareMessage",
    "RelationColumn",
    "RelationMessage",
    "RollbackPreparedMessage",
    "StreamAbortMessage",
    "StreamCommitMessage",
    "StreamPrepareMessage",
    "StreamStartMessage",
    "StreamStopMessage",
    "TruncateMessage",
    "TupleData",
    "TypeMessage",
    "UnchangedToast",
    "UpdateMessage",
    "message_type_name",
]


class MessageType(IntEnum):
    """The first byte of every message (``LogicalRepMsgType`` in PostgreSQL's logicalproto.h),
    the bytes ``layouts`` defines, named as an enum."""

    BEGIN = layouts.BEGIN
    COMMIT = layouts.COMMIT
    ORIGIN = layouts.ORIGIN
    RELATION = layouts.RELATION
    TYPE = layouts.TYPE
    INSERT = layouts.INSERT
    UPDATE = layouts.UPDATE
    DELETE = layouts.DELETE
    TRUNCATE = layouts.TRUNCATE
    MESSAGE = layouts.MESSAGE
    # protocol 2: streaming of in-progress transactions
    STREAM_START = layouts.STREAM_START
    STREAM_STOP = layouts.STREAM_STOP
    STREAM_COMMIT = layouts.STREAM_COMMIT
    STREAM_ABORT = layouts.STREAM_ABORT
    # protocol 3: two-phase commit
    BEGIN_PREPARE = layouts.BEGIN_PREPARE
    PREPARE = layouts.PREPARE
    COMMIT_PREPARED = layouts.COMMIT_PREPARED
    ROLLBACK_PREPARED = layouts.ROLLBACK_PREPARED
    STREAM_PREPARE = layouts.STREAM_PREPARE

    @property
    def char(self) -> str:
        """The byte as the character the documentation names it by (``'B'``)."""
        return chr(self.value)


def message_type_name(byte: int) -> str:
    """The message type as a character for error messages (``'I'``), or its code if unknown."""
    return chr(byte) if 0x20 < byte < 0x7F else f"\\x{byte:02x}"


class ColumnKind:
    """Per-column markers of TupleData: the byte before each column's value."""

    NULL: Final = layouts.KIND_NULL
    UNCHANGED_TOAST: Final = layouts.KIND_TOAST
    TEXT: Final = layouts.KIND_TEXT
    BINARY: Final = layouts.KIND_BINARY


class UnchangedToast:
    """The ``'u'`` marker: an UPDATE left this TOASTed value alone, so the server did not send it.

    There is exactly one instance, ``UNCHANGED_TOAST``. It is not NULL: the column keeps the value
    it had, which this message does not carry.
    """

    _instance: UnchangedToast | None = None

    def __new__(cls) -> UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast()


class Binary(bytes):
    """A ``'b'`` column: the value in its type's binary send format (``binary 'true'``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Binary({bytes(self)!r})"


# One entry per column, in the relation's column order: None for NULL ('n'), UNCHANGED_TOAST
# ('u'), bytes holding the UTF-8 text form ('t'), or Binary ('b').
TupleValue: TypeAlias = "bytes | UnchangedToast | None"
TupleData: TypeAlias = "tuple[bytes | UnchangedToast | None, ...]"

OldKind: TypeAlias = Literal["K", "O"]


@dataclass(frozen=True, slots=True)
class BeginMessage:
    """``B``: a transaction starts; its commit LSN and time are already known."""

    final_lsn: LSN
    commit_ts: dt.datetime
    xid: int


@dataclass(frozen=True, slots=True)
class CommitMessage:
    """``C``: the transaction announced by the last Begin committed."""

    flags: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_ts: dt.datetime


@dataclass(frozen=True, slots=True)
class OriginMessage:
    """``O``: the transaction was replayed from another node (replication origin)."""

    origin_lsn: LSN
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a Relation message."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        """Part of the replica identity (flag bit 1)."""
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class RelationMessage:
    """``R``: describes a table before the first change to it (and again after DDL)."""

    xid: int | None
    relation_id: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeMessage:
    """``Y``: names a non-built-in type a column uses (for a domain: the base type's name)."""

    xid: int | None
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class InsertMessage:
    """``I``: a new row."""

    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class UpdateMessage:
    """``U``: a changed row; ``old`` is the old key (``K``) or whole old row (``O``) when sent."""

    xid: int | None
    relation_id: int
    old_kind: OldKind | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class DeleteMessage:
    """``D``: a removed row, identified by its key (``K``) or its whole old row (``O``)."""

    xid: int | None
    relation_id: int
    old_kind: OldKind
    old: TupleData


TRUNCATE_CASCADE: Final = 1
TRUNCATE_RESTART_IDENTITY: Final = 2


@dataclass(frozen=True, slots=True)
class TruncateMessage:
    """``T``: one TRUNCATE statement, covering one or more tables."""

    xid: int | None
    flags: int
    relation_ids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.flags & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.flags & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class LogicalDecodingMessage:
    """``M``: ``pg_logical_emit_message(transactional, prefix, content)``."""

    xid: int | None
    flags: int
    lsn: LSN
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class StreamStartMessage:
    """``S``: a block of an in-progress (streamed) transaction's changes follows (protocol 2)."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStopMessage:
    """``E``: the current stream block ends."""


@dataclass(frozen=True, slots=True)
class StreamCommitMessage:
    """``c``: a streamed transaction committed; everything streamed for it now counts."""

    xid: int
    flags: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_ts: dt.datetime


@dataclass(frozen=True, slots=True)
class StreamAbortMessage:
    """``A``: a streamed (sub)transaction aborted (``subxid == xid`` for the whole transaction).

    ``abort_lsn`` and ``abort_ts`` are sent from protocol 4 on, and only with
    ``streaming 'parallel'``; otherwise they are None.
    """

    xid: int
    subxid: int
    abort_lsn: LSN | None = None
    abort_ts: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepareMessage:
    """``b``: a transaction that will be prepared (two-phase) starts (protocol 3)."""

    prepare_lsn: LSN
    end_lsn: LSN
    prepare_ts: dt.datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class PrepareMessage:
    """``P``: PREPARE TRANSACTION; the changes since Begin Prepare wait for COMMIT PREPARED."""

    flags: int
    prepare_lsn: LSN
    end_lsn: LSN
    prepare_ts: dt.datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPreparedMessage:
    """``K``: COMMIT PREPARED."""

    flags: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_ts: dt.datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPreparedMessage:
    """``r``: ROLLBACK PREPARED."""

    flags: int
    prepare_end_lsn: LSN
    rollback_end_lsn: LSN
    prepare_ts: dt.datetime
    rollback_ts: dt.datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepareMessage:
    """``p``: a streamed transaction was prepared (protocol 3)."""

    flags: int
    prepare_lsn: LSN
    end_lsn: LSN
    prepare_ts: dt.datetime
    xid: int
    gid: str


PgOutputMessage: TypeAlias = (
    BeginMessage
    | CommitMessage
    | OriginMessage
    | RelationMessage
    | TypeMessage
    | InsertMessage
    | UpdateMessage
    | DeleteMessage
    | TruncateMessage
    | LogicalDecodingMessage
    | StreamStartMessage
    | StreamStopMessage
    | StreamCommitMessage
    | StreamAbortMessage
    | BeginPrepareMessage
    | PrepareMessage
    | CommitPreparedMessage
    | RollbackPreparedMessage
    | StreamPrepareMessage
)
