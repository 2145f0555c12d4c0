"""A small pgoutput encoder, for tests only: message records back to the bytes the server sends.

Written from the protocol documentation, independently of the decoder, so round trips check the
decoder against the documented layout rather than against itself. The per-message unit tests do
not use it: they spell their byte buffers out with the helpers at the top.
See https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.messages import (
    UNCHANGED_TOAST,
    BeginMessage,
    BeginPrepareMessage,
    Binary,
    CommitMessage,
    CommitPreparedMessage,
    DeleteMessage,
    InsertMessage,
    LogicalDecodingMessage,
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
    TypeMessage,
    UpdateMessage,
)

if TYPE_CHECKING:
    from airflow_pglogrepl.pgoutput.table_info import TableInfo

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def u8(value: int) -> bytes:
    return struct.pack("!B", value)


def u16(value: int) -> bytes:
    return struct.pack("!H", value)


def u32(value: int) -> bytes:
    return struct.pack("!I", value)


def i32(value: int) -> bytes:
    return struct.pack("!i", value)


def u64(value: int | LSN) -> bytes:
    return struct.pack("!Q", int(value))


def ts(value: dt.datetime) -> bytes:
    delta = value - PG_EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return struct.pack("!q", micros)


def cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def tuple_data(values: Sequence[Any]) -> bytes:
    """TupleData: None -> 'n', UNCHANGED_TOAST -> 'u', Binary -> 'b', bytes/str -> 't'."""
    out = [u16(len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(value, Binary):
            out += [b"b", u32(len(value)), bytes(value)]
        else:
            raw = value.encode() if isinstance(value, str) else bytes(value)
            out += [b"t", u32(len(raw)), raw]
    return b"".join(out)


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else u32(xid)


def encode(message: PgOutputMessage) -> bytes:
    """The wire form of one message; data messages carry their xid when it is not None."""
    m = message
    if isinstance(m, BeginMessage):
        return b"B" + u64(m.final_lsn) + ts(m.commit_ts) + u32(m.xid)
    if isinstance(m, CommitMessage):
        return b"C" + u8(m.flags) + u64(m.commit_lsn) + u64(m.end_lsn) + ts(m.commit_ts)
    if isinstance(m, OriginMessage):
        return b"O" + u64(m.origin_lsn) + cstr(m.name)
    if isinstance(m, RelationMessage):
        namespace = "" if m.namespace == "pg_catalog" else m.namespace
        out = [b"R", _xid(m.xid), u32(m.relation_id), cstr(namespace), cstr(m.name)]
        out += [m.replica_identity.encode(), u16(len(m.columns))]
        for c in m.columns:
            out += [u8(c.flags), cstr(c.name), u32(c.type_oid), i32(c.type_modifier)]
        return b"".join(out)
    if isinstance(m, TypeMessage):
        namespace = "" if m.namespace == "pg_catalog" else m.namespace
        return b"Y" + _xid(m.xid) + u32(m.type_oid) + cstr(namespace) + cstr(m.name)
    if isinstance(m, InsertMessage):
        return b"I" + _xid(m.xid) + u32(m.relation_id) + b"N" + tuple_data(m.new)
    if isinstance(m, UpdateMessage):
        old = b"" if m.old is None else (m.old_kind or "K").encode() + tuple_data(m.old)
        return b"U" + _xid(m.xid) + u32(m.relation_id) + old + b"N" + tuple_data(m.new)
    if isinstance(m, DeleteMessage):
        return b"D" + _xid(m.xid) + u32(m.relation_id) + m.old_kind.encode() + tuple_data(m.old)
    if isinstance(m, TruncateMessage):
        ids = b"".join(u32(i) for i in m.relation_ids)
        return b"T" + _xid(m.xid) + u32(len(m.relation_ids)) + u8(m.flags) + ids
    if isinstance(m, LogicalDecodingMessage):
        return (
            b"M" + _xid(m.xid) + u8(m.flags) + u64(m.lsn) + cstr(m.prefix)
            + u32(len(m.content)) + m.content
        )  # fmt: skip
    if isinstance(m, StreamStartMessage):
        return b"S" + u32(m.xid) + u8(1 if m.first_segment else 0)
    if isinstance(m, StreamStopMessage):
        return b"E"
    if isinstance(m, StreamCommitMessage):
        return (
            b"c" + u32(m.xid) + u8(m.flags) + u64(m.commit_lsn) + u64(m.end_lsn)
            + ts(m.commit_ts)
        )  # fmt: skip
    if isinstance(m, StreamAbortMessage):
        extra = b""
        if m.abort_lsn is not None:
            assert m.abort_ts is not None
            extra = u64(m.abort_lsn) + ts(m.abort_ts)
        return b"A" + u32(m.xid) + u32(m.subxid) + extra
    if isinstance(m, BeginPrepareMessage):
        return (
            b"b" + u64(m.prepare_lsn) + u64(m.end_lsn) + ts(m.prepare_ts) + u32(m.xid)
            + cstr(m.gid)
        )  # fmt: skip
    if isinstance(m, PrepareMessage | StreamPrepareMessage):
        kind = b"P" if isinstance(m, PrepareMessage) else b"p"
        return (
            kind + u8(m.flags) + u64(m.prepare_lsn) + u64(m.end_lsn) + ts(m.prepare_ts)
            + u32(m.xid) + cstr(m.gid)
        )  # fmt: skip
    if isinstance(m, CommitPreparedMessage):
        return (
            b"K" + u8(m.flags) + u64(m.commit_lsn) + u64(m.end_lsn) + ts(m.commit_ts)
            + u32(m.xid) + cstr(m.gid)
        )  # fmt: skip
    if isinstance(m, RollbackPreparedMessage):
        return (
            b"r" + u8(m.flags) + u64(m.prepare_end_lsn) + u64(m.rollback_end_lsn)
            + ts(m.prepare_ts) + ts(m.rollback_ts) + u32(m.xid) + cstr(m.gid)
        )  # fmt: skip
    raise TypeError(f"cannot encode {message!r}")


# -- building whole sessions ------------------------------------------------------------------

T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)


def relation(
    relation_id: int,
    name: str,
    columns: Iterable[tuple[str, int] | tuple[str, int, bool] | tuple[str, int, bool, int]],
    *,
    namespace: str = "public",
    identity: str = "d",
    xid: int | None = None,
) -> RelationMessage:
    """A Relation message from ``(name, type OID[, is key[, typmod]])`` columns."""
    cols = []
    for column in columns:
        col_name, oid = column[0], column[1]
        key = bool(column[2]) if len(column) > 2 else False  # type: ignore[misc]
        typmod = int(column[3]) if len(column) > 3 else -1  # type: ignore[misc]
        cols.append(RelationColumn(1 if key else 0, col_name, oid, typmod))
    return RelationMessage(xid, relation_id, namespace, name, identity, tuple(cols))


# the relation most decoder tests send: a key, a text and a numeric(10,2)
ACCOUNTS = relation(
    16384,
    "accounts",
    [
        ("id", 23, True),  # int4
        ("owner", 25),  # text
        ("balance", 1700, False, (10 << 16 | 2) + 4),  # numeric(10,2)
    ],
)


def table_t() -> TableInfo:
    """A decoded table description: ``public.t (id int4 key, v text, n int8)``."""
    from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
    from airflow_pglogrepl.pgoutput.values import OID

    return TableInfo("public", "t", [
        ColumnInfo("id", OID.INT4, -1, True, OID.INT4, "integer"),
        ColumnInfo("v", OID.TEXT, -1, False, OID.TEXT, "text"),
        ColumnInfo("n", OID.INT8, -1, False, OID.INT8, "bigint"),
    ], relation_id=16384, replica_identity="d")  # fmt: skip


class Session:
    """Rows as ``pg_logical_slot_peek_binary_changes`` returns them, LSNs counting up."""

    def __init__(self, start: int = 0x1000) -> None:
        self.rows: list[tuple[LSN, int | None, bytes]] = []
        self.lsn = start

    def add(self, *messages: PgOutputMessage, xid: int | None = None) -> Session:
        for message in messages:
            self.lsn += 0x10
            self.rows.append((LSN(self.lsn), xid, encode(message)))
        return self

    def raw(self, data: bytes) -> Session:
        self.lsn += 0x10
        self.rows.append((LSN(self.lsn), None, data))
        return self

    def begin(self, xid: int, final_lsn: int, when: dt.datetime = T0) -> Session:
        return self.add(BeginMessage(LSN(final_lsn), when, xid), xid=xid)

    def commit(self, final_lsn: int, end_lsn: int, when: dt.datetime = T0) -> Session:
        return self.add(CommitMessage(0, LSN(final_lsn), LSN(end_lsn), when))

    def insert(self, relation_id: int, *values: Any, xid: int | None = None) -> Session:
        return self.add(InsertMessage(xid, relation_id, tuple(values)))
