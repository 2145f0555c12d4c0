"""Bytes to pgoutput message records: parsing only, no state, no server.

``decode_message`` turns one row of ``pg_logical_slot_peek_binary_changes`` into one record of
``messages``. Every read checks the bytes left first, so a truncated or corrupt buffer raises
``DecodeError`` naming the message type and the byte offset, never ``IndexError`` or a half-read
record; a message must also end exactly where its last field ends.

Whether a data message starts with a transaction id depends on context the bytes do not carry
(inside a Stream Start/Stop block, protocol 2+), and so do the protocol-4 Stream Abort fields
(sent only with ``streaming 'parallel'``): the caller says which, as with jackc/pglogrepl's
``ParseV2(data, inStream)``.
See https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable
from typing import Any, Final

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.layouts import WITH_XID_IN_BLOCK
from airflow_pglogrepl.pgoutput.messages import (
    BeginMessage,
    BeginPrepareMessage,
    CommitMessage,
    CommitPreparedMessage,
    DeleteMessage,
    InsertMessage,
    LogicalDecodingMessage,
    MessageType,
    OldKind,
    OriginMessage,
    PgOutputMessage,
    PrepareMessage,
    RelationColumn,
    RelationMessage,
    RollbackPreparedMessage,
    StreamAbortMessage,
    StreamCommitMessage,
    StreamPrepareMessage,
    StreamStartMessage,
    StreamStopMessage,
    TruncateMessage,
    TupleData,
    TypeMessage,
    UpdateMessage,
    message_type_name,
)
from airflow_pglogrepl.pgoutput.tuples import parse_tuple

__all__ = ["MAX_PROTOCOL_VERSION", "check_protocol_version", "decode_message", "pg_timestamp"]

MAX_PROTOCOL_VERSION: Final = 4

_U16 = struct.Struct("!H").unpack_from
_U32 = struct.Struct("!I").unpack_from
_I32 = struct.Struct("!i").unpack_from
_U64 = struct.Struct("!Q").unpack_from
_I64 = struct.Struct("!q").unpack_from

_PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def pg_timestamp(micros: int, mtype: str = "?", offset: int = 0) -> dt.datetime:
    """A protocol TimestampTz (microseconds since 2000-01-01 UTC) as an aware datetime."""
    try:
        return _PG_EPOCH + dt.timedelta(microseconds=micros)
    except OverflowError:
        raise DecodeError(mtype, offset, f"timestamp {micros} is out of range") from None


class _Reader:
    """Checked sequential reads from one message; every shortfall is a DecodeError."""

    __slots__ = ("data", "mtype", "pos")

    def __init__(self, data: bytes, mtype: str, pos: int = 1) -> None:
        self.data = data
        self.mtype = mtype
        self.pos = pos

    def _need(self, size: int, what: str) -> int:
        pos = self.pos
        if pos + size > len(self.data):
            raise DecodeError(
                self.mtype,
                pos,
                f"message ends inside {what} (needs {size} bytes, {len(self.data) - pos} left)",
            )
        self.pos = pos + size
        return pos

    def u8(self, what: str) -> int:
        return self.data[self._need(1, what)]

    def u16(self, what: str) -> int:
        return int(_U16(self.data, self._need(2, what))[0])

    def u32(self, what: str) -> int:
        return int(_U32(self.data, self._need(4, what))[0])

    def i32(self, what: str) -> int:
        return int(_I32(self.data, self._need(4, what))[0])

    def lsn(self, what: str) -> LSN:
        return LSN(_U64(self.data, self._need(8, what))[0])

    def timestamp(self, what: str) -> dt.datetime:
        pos = self._need(8, what)
        return pg_timestamp(_I64(self.data, pos)[0], self.mtype, pos)

    def string(self, what: str) -> str:
        data, pos = self.data, self.pos
        stop = data.find(b"\x00", pos)
        if stop < 0:
            raise DecodeError(self.mtype, len(data), f"{what} is not NUL-terminated")
        try:
            text = data[pos:stop].decode()
        except UnicodeDecodeError as exc:
            raise DecodeError(self.mtype, pos + exc.start, f"{what} is not UTF-8") from None
        self.pos = stop + 1
        return text

    def raw(self, size: int, what: str) -> bytes:
        pos = self._need(size, what)
        return bytes(self.data[pos : pos + size])

    def tuple(self) -> list[Any]:
        values, self.pos = parse_tuple(self.data, self.pos, self.mtype)
        return values

    def end(self) -> None:
        if self.pos != len(self.data):
            raise DecodeError(
                self.mtype,
                self.pos,
                f"{len(self.data) - self.pos} unexpected bytes after the last field (wrong "
                f"proto_version, or a streamed message read outside its stream?)",
            )


def _xid(r: _Reader, in_stream: bool) -> int | None:
    return r.u32("transaction id") if in_stream else None


def _begin(r: _Reader, in_stream: bool, abort_info: bool) -> BeginMessage:
    final_lsn = r.lsn("final LSN")
    if int(final_lsn) == 0:
        raise DecodeError(r.mtype, 1, "final LSN is 0/0")
    return BeginMessage(final_lsn, r.timestamp("commit timestamp"), r.u32("xid"))


def _commit(r: _Reader, in_stream: bool, abort_info: bool) -> CommitMessage:
    return CommitMessage(
        r.u8("flags"), r.lsn("commit LSN"), r.lsn("end LSN"), r.timestamp("commit timestamp")
    )


def _origin(r: _Reader, in_stream: bool, abort_info: bool) -> OriginMessage:
    return OriginMessage(r.lsn("origin LSN"), r.string("origin name"))


def _relation(r: _Reader, in_stream: bool, abort_info: bool) -> RelationMessage:
    xid = _xid(r, in_stream)
    relation_id = r.u32("relation OID")
    namespace = r.string("namespace") or "pg_catalog"  # empty means pg_catalog, to save space
    name = r.string("relation name")
    identity = chr(r.u8("replica identity"))
    if identity not in "dnfi":
        raise DecodeError(r.mtype, r.pos - 1, f"unknown replica identity {identity!r}")
    natts = r.u16("column count")
    columns = []
    for i in range(natts):
        flags = r.u8(f"column {i} flags")
        column_name = r.string(f"column {i} name")
        columns.append(
            RelationColumn(
                flags, column_name, r.u32(f"column {i} type OID"), r.i32(f"column {i} typmod")
            )
        )
    return RelationMessage(xid, relation_id, namespace, name, identity, tuple(columns))


def _type(r: _Reader, in_stream: bool, abort_info: bool) -> TypeMessage:
    xid = _xid(r, in_stream)
    type_oid = r.u32("type OID")
    namespace = r.string("namespace") or "pg_catalog"
    return TypeMessage(xid, type_oid, namespace, r.string("type name"))


def _marker(r: _Reader, allowed: str, what: str) -> str:
    pos = r.pos
    byte = r.u8(what)
    char = chr(byte)
    if char not in allowed:
        raise DecodeError(
            r.mtype, pos, f"expected {what} {' or '.join(map(repr, allowed))}, got "
            f"{message_type_name(byte)!r}"
        )  # fmt: skip
    return char


def _insert(r: _Reader, in_stream: bool, abort_info: bool) -> InsertMessage:
    xid = _xid(r, in_stream)
    relation_id = r.u32("relation OID")
    _marker(r, "N", "new-tuple marker")
    return InsertMessage(xid, relation_id, tuple(r.tuple()))


def _update(r: _Reader, in_stream: bool, abort_info: bool) -> UpdateMessage:
    xid = _xid(r, in_stream)
    relation_id = r.u32("relation OID")
    kind = _marker(r, "KON", "tuple marker")
    old: TupleData | None = None
    old_kind: OldKind | None = None
    if kind != "N":
        old_kind = "K" if kind == "K" else "O"
        old = tuple(r.tuple())
        _marker(r, "N", "new-tuple marker")
    return UpdateMessage(xid, relation_id, old_kind, old, tuple(r.tuple()))


def _delete(r: _Reader, in_stream: bool, abort_info: bool) -> DeleteMessage:
    xid = _xid(r, in_stream)
    relation_id = r.u32("relation OID")
    kind: OldKind = "K" if _marker(r, "KO", "old-tuple marker") == "K" else "O"
    return DeleteMessage(xid, relation_id, kind, tuple(r.tuple()))


def _truncate(r: _Reader, in_stream: bool, abort_info: bool) -> TruncateMessage:
    xid = _xid(r, in_stream)
    count = r.u32("relation count")
    flags = r.u8("options")
    if count > (len(r.data) - r.pos) // 4:
        raise DecodeError(r.mtype, r.pos, f"{count} relations announced, too few bytes left")
    ids = tuple(r.u32(f"relation {i} OID") for i in range(count))
    return TruncateMessage(xid, flags, ids)


def _message(r: _Reader, in_stream: bool, abort_info: bool) -> LogicalDecodingMessage:
    xid = _xid(r, in_stream)
    flags = r.u8("flags")
    lsn = r.lsn("message LSN")
    prefix = r.string("prefix")
    size = r.u32("content length")
    return LogicalDecodingMessage(xid, flags, lsn, prefix, r.raw(size, "content"))


def _stream_start(r: _Reader, in_stream: bool, abort_info: bool) -> StreamStartMessage:
    xid = r.u32("xid")
    return StreamStartMessage(xid, r.u8("first-segment flag") == 1)


def _stream_stop(r: _Reader, in_stream: bool, abort_info: bool) -> StreamStopMessage:
    return StreamStopMessage()


def _stream_commit(r: _Reader, in_stream: bool, abort_info: bool) -> StreamCommitMessage:
    xid = r.u32("xid")
    return StreamCommitMessage(
        xid,
        r.u8("flags"),
        r.lsn("commit LSN"),
        r.lsn("end LSN"),
        r.timestamp("commit timestamp"),
    )


def _stream_abort(r: _Reader, in_stream: bool, abort_info: bool) -> StreamAbortMessage:
    xid = r.u32("xid")
    subxid = r.u32("subtransaction xid")
    if not abort_info:
        return StreamAbortMessage(xid, subxid)
    return StreamAbortMessage(xid, subxid, r.lsn("abort LSN"), r.timestamp("abort timestamp"))


def _begin_prepare(r: _Reader, in_stream: bool, abort_info: bool) -> BeginPrepareMessage:
    return BeginPrepareMessage(
        r.lsn("prepare LSN"),
        r.lsn("end LSN"),
        r.timestamp("prepare timestamp"),
        r.u32("xid"),
        r.string("gid"),
    )


def _prepare_fields(r: _Reader) -> tuple[int, LSN, LSN, dt.datetime, int, str]:
    return (
        r.u8("flags"),
        r.lsn("prepare LSN"),
        r.lsn("end LSN"),
        r.timestamp("prepare timestamp"),
        r.u32("xid"),
        r.string("gid"),
    )


def _prepare(r: _Reader, in_stream: bool, abort_info: bool) -> PrepareMessage:
    return PrepareMessage(*_prepare_fields(r))


def _stream_prepare(r: _Reader, in_stream: bool, abort_info: bool) -> StreamPrepareMessage:
    return StreamPrepareMessage(*_prepare_fields(r))


def _commit_prepared(r: _Reader, in_stream: bool, abort_info: bool) -> CommitPreparedMessage:
    return CommitPreparedMessage(
        r.u8("flags"),
        r.lsn("commit LSN"),
        r.lsn("end LSN"),
        r.timestamp("commit timestamp"),
        r.u32("xid"),
        r.string("gid"),
    )


def _rollback_prepared(r: _Reader, in_stream: bool, abort_info: bool) -> RollbackPreparedMessage:
    return RollbackPreparedMessage(
        r.u8("flags"),
        r.lsn("prepare end LSN"),
        r.lsn("rollback end LSN"),
        r.timestamp("prepare timestamp"),
        r.timestamp("rollback timestamp"),
        r.u32("xid"),
        r.string("gid"),
    )


_Parser = Callable[[_Reader, bool, bool], PgOutputMessage]

# message type -> (parser, lowest protocol version that sends it)
PARSERS: Final[dict[int, tuple[_Parser, int]]] = {
    MessageType.BEGIN: (_begin, 1),
    MessageType.COMMIT: (_commit, 1),
    MessageType.ORIGIN: (_origin, 1),
    MessageType.RELATION: (_relation, 1),
    MessageType.TYPE: (_type, 1),
    MessageType.INSERT: (_insert, 1),
    MessageType.UPDATE: (_update, 1),
    MessageType.DELETE: (_delete, 1),
    MessageType.TRUNCATE: (_truncate, 1),
    MessageType.MESSAGE: (_message, 1),
    MessageType.STREAM_START: (_stream_start, 2),
    MessageType.STREAM_STOP: (_stream_stop, 2),
    MessageType.STREAM_COMMIT: (_stream_commit, 2),
    MessageType.STREAM_ABORT: (_stream_abort, 2),
    MessageType.BEGIN_PREPARE: (_begin_prepare, 3),
    MessageType.PREPARE: (_prepare, 3),
    MessageType.COMMIT_PREPARED: (_commit_prepared, 3),
    MessageType.ROLLBACK_PREPARED: (_rollback_prepared, 3),
    MessageType.STREAM_PREPARE: (_stream_prepare, 3),
}

# data messages carry the (sub)transaction id first while inside a stream block
STREAMABLE: Final = frozenset(WITH_XID_IN_BLOCK)


def check_protocol_version(proto_version: int) -> None:
    """Reject protocol versions this decoder does not know."""
    if not 1 <= proto_version <= MAX_PROTOCOL_VERSION:
        raise ValueError(
            f"pgoutput proto_version {proto_version} is not supported; use 1 to "
            f"{MAX_PROTOCOL_VERSION}"
        )


def decode_message(
    data: bytes | bytearray | memoryview,
    *,
    proto_version: int = 1,
    in_stream: bool = False,
    abort_info: bool = False,
) -> PgOutputMessage:
    """Decode one pgoutput message.

    :param proto_version: the ``proto_version`` the slot was read with (1 to 4); message types
        introduced by a later version are rejected.
    :param in_stream: the message arrived between Stream Start and Stream Stop, so data messages
        (Relation, Type, Insert, Update, Delete, Truncate, Message) start with a transaction id.
    :param abort_info: Stream Abort carries the abort LSN and timestamp (protocol 4 with
        ``streaming 'parallel'``).
    :raises DecodeError: truncated, corrupt, trailing bytes, or a type this version cannot send.
    """
    check_protocol_version(proto_version)
    if not isinstance(data, bytes):
        data = bytes(data)
    if not data:
        raise DecodeError("?", 0, "empty message")
    byte = data[0]
    mtype = message_type_name(byte)
    entry = PARSERS.get(byte)
    if entry is None:
        raise DecodeError(mtype, 0, "unknown pgoutput message type")
    parser, since = entry
    if proto_version < since:
        raise DecodeError(mtype, 0, f"message type needs proto_version {since} or later")
    if in_stream and proto_version < 2:
        raise DecodeError(mtype, 0, "stream blocks need proto_version 2 or later")
    if abort_info and proto_version < 4:
        raise DecodeError(mtype, 0, "Stream Abort abort info needs proto_version 4 or later")
    reader = _Reader(data, mtype)
    message = parser(reader, in_stream and byte in STREAMABLE, abort_info)
    reader.end()
    return message
