"""``PgOutputStream``: pgoutput rows in, committed changes out, in commit order.

The drain reads ``(lsn, xid, data)`` rows from ``pg_logical_slot_peek_binary_changes`` and feeds
them here in order. The stream keeps what the protocol leaves to the receiver:

- the relation cache: Relation messages name a table's columns, types and key once, later data
  messages only carry its OID (a Type message names a non-built-in column type);
- transactions: an ordinary transaction's changes are passed through as they come (its commit
  LSN and time are in its Begin), so memory stays flat however big it is;
- streamed transactions (protocol 2, ``streaming 'on'``): their changes arrive in blocks before
  the transaction ends, interleaved with other transactions. They wait in a ``TransactionBuffer``
  and come out only when Stream Commit arrives; Stream Abort drops them, for a sub-transaction
  only what it (and what followed it) did;
- two-phase transactions (protocol 3, ``two_phase 'on'``): changes between Begin Prepare and
  Prepare (or a Stream Prepare) wait until COMMIT PREPARED, and are dropped on ROLLBACK PREPARED.

The messages that open, deliver and drop those two kinds of waiting transactions are handled by
``waiting_transactions.WaitingTransactionsMixin``, which the stream inherits.

Parsing of each message is ``parser``'s; Insert/Update/Delete, which are nearly all of the
traffic, are parsed inline here with the same checks, to keep up with the server.
See https://www.postgresql.org/docs/15/protocol-logical-replication.html
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import GeneratorType
from typing import Any, Final, Literal

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.buffer import (
    InMemoryTransactionBuffer,
    Pending,
    Prepared,
    TransactionBuffer,
)
from airflow_pglogrepl.pgoutput.changes import (
    FLAG_OLD_IS_KEY,
    Change,
    Event,
    LogicalMessage,
    TransactionBegin,
    TransactionCommit,
)
from airflow_pglogrepl.pgoutput.layouts import NEW_TUPLE, OLD_KEY, OLD_ROW
from airflow_pglogrepl.pgoutput.messages import (
    BeginMessage,
    BeginPrepareMessage,
    CommitMessage,
    LogicalDecodingMessage,
    MessageType,
    OriginMessage,
    PgOutputMessage,
    RelationMessage,
    TruncateMessage,
    TypeMessage,
    message_type_name,
)
from airflow_pglogrepl.pgoutput.parser import check_protocol_version, decode_message
from airflow_pglogrepl.pgoutput.relations import RelationCache
from airflow_pglogrepl.pgoutput.table_info import TableInfo
from airflow_pglogrepl.pgoutput.tuples import as_bytes
from airflow_pglogrepl.pgoutput.waiting_transactions import WaitingTransactionsMixin

__all__ = ["PgOutputStream"]

_U32 = struct.Struct("!I").unpack_from
_MULTI: Final = (list, tuple, GeneratorType)


class PgOutputStream(WaitingTransactionsMixin):
    """Decode pgoutput rows into ``Change``/``LogicalMessage`` records with transaction bounds.

    :param proto_version: the ``proto_version`` option the slot is read with (1 to 4).
    :param abort_info: the slot is read with ``streaming 'parallel'`` at protocol 4, so Stream
        Abort carries the abort LSN and time.
    :param buffer: where streamed and prepared transactions wait; in memory by default.

    Feed rows with ``decode(rows)`` (a generator over events) or ``feed(lsn, data)``. Decoding
    must start where the slot starts sending (its confirmed position): pgoutput describes each
    table again in every decoding session, before its first change.
    """

    def __init__(
        self,
        *,
        proto_version: int = 1,
        abort_info: bool = False,
        buffer: TransactionBuffer | None = None,
    ) -> None:
        check_protocol_version(proto_version)
        if abort_info and proto_version < 4:
            raise ValueError("abort_info (streaming 'parallel') needs proto_version 4")
        self.proto_version = proto_version
        self.abort_info = abort_info
        self._buffer: TransactionBuffer = buffer if buffer is not None else (
            InMemoryTransactionBuffer()
        )  # fmt: skip
        self._relations = RelationCache(proto_version=proto_version)
        # the cache's dicts (changed in place, never replaced), bound for the inline paths
        self._tables = self._relations.tables
        self._fast_tables = self._relations.fast_tables
        # the ordinary transaction being passed through, and its record counter
        self._txn: TransactionBegin | None = None
        self._seq = 0
        self._origin: str | None = None
        # a two-phase transaction between Begin Prepare and Prepare
        self._preparing: BeginPrepareMessage | None = None
        # the streamed transaction whose block is open, and every open streamed transaction's
        # own Relation messages (applied to the cache when it commits, like the apply worker)
        self._stream_xid: int | None = None
        self._streams: dict[int, dict[int, TableInfo]] = {}
        self._prepared: dict[str, Prepared] = {}
        handlers: dict[int, Callable[[LSN, bytes], Any]] = {
            MessageType.BEGIN: self._on_begin,
            MessageType.COMMIT: self._on_commit,
            MessageType.ORIGIN: self._on_origin,
            MessageType.RELATION: self._on_relation,
            MessageType.TYPE: self._on_type,
            MessageType.INSERT: self._on_insert,
            MessageType.UPDATE: self._on_update,
            MessageType.DELETE: self._on_delete,
            MessageType.TRUNCATE: self._on_truncate,
            MessageType.MESSAGE: self._on_message,
        }
        if proto_version >= 2:
            handlers.update(
                {
                    MessageType.STREAM_START: self._on_stream_start,
                    MessageType.STREAM_STOP: self._on_stream_stop,
                    MessageType.STREAM_COMMIT: self._on_stream_commit,
                    MessageType.STREAM_ABORT: self._on_stream_abort,
                }
            )
        if proto_version >= 3:
            handlers.update(
                {
                    MessageType.BEGIN_PREPARE: self._on_begin_prepare,
                    MessageType.PREPARE: self._on_prepare,
                    MessageType.COMMIT_PREPARED: self._on_commit_prepared,
                    MessageType.ROLLBACK_PREPARED: self._on_rollback_prepared,
                    MessageType.STREAM_PREPARE: self._on_stream_prepare,
                }
            )
        self._handlers: dict[int, Any] = {int(k): v for k, v in handlers.items()}

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], *, buffer: TransactionBuffer | None = None
    ) -> PgOutputStream:
        """A stream for rows peeked with these pgoutput options (``proto_version``,
        ``streaming``), so the drain states them once."""
        version = int(options.get("proto_version", "1"))
        parallel = options.get("streaming", "off").lower() == "parallel"
        return cls(proto_version=version, abort_info=parallel and version >= 4, buffer=buffer)

    # -- state a drain may inspect --------------------------------------------------------

    @property
    def tables(self) -> Mapping[int, TableInfo]:
        """The relation cache: relation OID -> current ``TableInfo``."""
        return self._tables

    @property
    def in_transaction(self) -> bool:
        """Between a Begin (or Begin Prepare) and its Commit (or Prepare)."""
        return self._txn is not None or self._preparing is not None

    @property
    def open_streamed_xids(self) -> list[int]:
        """Streamed transactions seen but not yet committed or aborted (their changes wait)."""
        return list(self._streams)

    @property
    def prepared_gids(self) -> list[str]:
        """Prepared transactions waiting for COMMIT/ROLLBACK PREPARED."""
        return list(self._prepared)

    @property
    def oldest_pending_lsn(self) -> LSN | None:
        """The prepare LSN of the oldest waiting prepared transaction (do not advance past it)."""
        lsns = [p.prepare_lsn for p in self._prepared.values()]
        return min(lsns) if lsns else None

    # -- feeding --------------------------------------------------------------------------

    def decode(self, rows: Iterable[Sequence[Any]]) -> Iterator[Event]:
        """Decode ``(lsn, xid, data)`` rows (as the hook's ``peek_changes`` yields them)."""
        handlers = self._handlers
        # While an ordinary transaction is open, its plain Inserts and Updates (nearly all of
        # the traffic) are decoded right here with local state: one dict probe on the relation
        # OID and 'N' marker bytes, one generated parser, no method call. Anything unusual falls
        # through to the handlers, which check everything and name what is wrong.
        fast = self._fast_tables
        txn = self._fast_txn()
        seq = self._seq
        try:
            for lsn, _xid, data in rows:
                if lsn.__class__ is not LSN:
                    lsn = LSN(lsn)
                if data.__class__ is not bytes:
                    data = as_bytes(data)
                if txn is not None:
                    table = fast.get(data[1:6])
                    if table is not None:
                        kind = data[0]
                        if kind == 73 or kind == 85:  # 'I', 'U'
                            new = table.parse_row(data)
                            if new is not None:
                                seq += 1  # before the yield: a consumer may stop at it
                                yield Change(
                                    "I" if kind == 73 else "U", table, txn, lsn, seq - 1, new, None
                                )
                                continue
                self._seq = seq
                try:
                    handler = handlers[data[0]]
                except (KeyError, IndexError):
                    raise self._bad_type(data) from None
                try:
                    result = handler(lsn, data)
                except DecodeError as exc:
                    exc.add_note(f"pgoutput row at LSN {lsn}")
                    raise
                txn = self._fast_txn()
                seq = self._seq
                if result is None:
                    continue
                if result.__class__ in _MULTI:
                    yield from result
                else:
                    yield result
        finally:
            # the inline path counts in a local: hand it back however the decode ends (a
            # row at a time through feed, or a consumer that stopped early)
            self._seq = seq

    def _fast_txn(self) -> TransactionBegin | None:
        """The open ordinary transaction, when its changes can take the inline path."""
        return self._txn if self._stream_xid is None and self._preparing is None else None

    def feed(self, lsn: LSN | int | str, data: bytes | bytearray | memoryview) -> list[Event]:
        """Decode one row; return the events it completes (often one, sometimes none)."""
        return list(self.decode(((lsn, None, data),)))

    def _bad_type(self, data: bytes) -> DecodeError:
        if not data:
            return DecodeError("?", 0, "empty message")
        mtype = message_type_name(data[0])
        for version in range(self.proto_version + 1, 5):
            if data[0] in PgOutputStream(proto_version=version)._handlers:
                return DecodeError(
                    mtype, 0, f"message type needs proto_version {version}, the stream was "
                    f"created for {self.proto_version}"
                )  # fmt: skip
        return DecodeError(mtype, 0, "unknown pgoutput message type")

    def _parse(self, data: bytes, in_stream: bool = False) -> PgOutputMessage:
        return decode_message(
            data,
            proto_version=self.proto_version,
            in_stream=in_stream,
            abort_info=self.abort_info,
        )

    # -- transactions ---------------------------------------------------------------------

    def _require_idle(self, mtype: str) -> None:
        if self._txn is not None or self._preparing is not None:
            raise DecodeError(mtype, 0, "transaction starts while another is still open")
        if self._stream_xid is not None:
            raise DecodeError(mtype, 0, "arrived inside a stream block (no Stream Stop)")

    def _on_begin(self, lsn: LSN, data: bytes) -> Event:
        message = self._parse(data)
        assert isinstance(message, BeginMessage)
        self._require_idle("B")
        txn = TransactionBegin(message.xid, message.final_lsn, message.commit_ts)
        self._txn = txn
        self._seq = 0
        self._origin = None
        return txn

    def _on_commit(self, lsn: LSN, data: bytes) -> Event:
        message = self._parse(data)
        assert isinstance(message, CommitMessage)
        txn = self._txn
        if txn is None:
            raise DecodeError("C", 0, "Commit without Begin")
        if message.commit_lsn != txn.commit_lsn:
            raise DecodeError(
                "C", 2, f"Commit LSN {message.commit_lsn} differs from Begin's {txn.commit_lsn}"
            )
        self._txn = None
        return TransactionCommit(
            txn.xid, txn.commit_lsn, message.end_lsn, txn.commit_ts, self._seq, None, self._origin
        )

    def _on_origin(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data)
        assert isinstance(message, OriginMessage)
        if not self.in_transaction:
            raise DecodeError("O", 0, "Origin outside a transaction")
        self._origin = message.name

    # -- relations ------------------------------------------------------------------------

    def _on_relation(self, lsn: LSN, data: bytes) -> None:
        stream_xid = self._stream_xid
        message = self._parse(data, in_stream=stream_xid is not None)
        assert isinstance(message, RelationMessage)
        table = self._relations.relation(message)
        if stream_xid is None:
            self._relations.describe(table)
        else:
            self._streams[stream_xid][message.relation_id] = table

    def _on_type(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data, in_stream=self._stream_xid is not None)
        assert isinstance(message, TypeMessage)
        self._relations.add_type(message)

    # -- data -----------------------------------------------------------------------------

    def _header(self, data: bytes, mtype: str) -> tuple[int, int, int]:
        """(subxid or 0, relation OID, position after it) of a data message, checked."""
        if self._stream_xid is None:
            if len(data) < 6:
                raise DecodeError(mtype, len(data), "message ends inside the relation OID")
            return 0, _U32(data, 1)[0], 5
        if len(data) < 10:
            raise DecodeError(mtype, len(data), "message ends inside the xid or relation OID")
        return _U32(data, 1)[0], _U32(data, 5)[0], 9

    def _emit(
        self,
        op: str,
        table: TableInfo,
        lsn: LSN,
        new: Any,
        old: Any,
        flags: int,
        subxid: int,
    ) -> Change | None:
        txn = self._txn
        if txn is not None and self._stream_xid is None:
            seq = self._seq
            self._seq = seq + 1
            return Change(op, table, txn, lsn, seq, new, old, flags)  # type: ignore[arg-type]
        self._pend(op, (op, table, lsn, new, old, flags), subxid)
        return None

    def _pend(self, mtype: str, item: Pending, subxid: int) -> None:
        stream_xid = self._stream_xid
        if stream_xid is not None:
            self._buffer.append(("stream", stream_xid), subxid, item)
        elif self._preparing is not None:
            self._buffer.append(("prepared", self._preparing.gid), self._preparing.xid, item)
        else:
            raise DecodeError(mtype, 0, "data message outside a transaction or stream block")

    # Insert and Update of ordinary transactions are nearly all of the traffic: their handlers
    # start with a straight path for that case (literal bytes: 78 is 'N', 75 'K', 79 'O') and
    # leave everything else (streams, prepared transactions, old tuples, errors) to _row.

    def _on_insert(self, lsn: LSN, data: bytes) -> Change | None:
        return self._new_tuple_only("I", lsn, data)

    def _on_update(self, lsn: LSN, data: bytes) -> Change | None:
        return self._new_tuple_only("U", lsn, data)

    def _new_tuple_only(self, op: Literal["I", "U"], lsn: LSN, data: bytes) -> Change | None:
        txn = self._txn
        if txn is None or self._stream_xid is not None or len(data) < 7 or data[5] != 78:
            return self._row(op, lsn, data)
        table = self._tables.get(_U32(data, 1)[0])
        if table is None:
            return self._row(op, lsn, data)
        new, pos = table.parse(data, 6, op)
        if pos != len(data) or len(new) != len(table.names):
            return self._row(op, lsn, data)
        seq = self._seq
        self._seq = seq + 1
        return Change(op, table, txn, lsn, seq, new, None)

    def _on_delete(self, lsn: LSN, data: bytes) -> Change | None:
        return self._row("D", lsn, data)

    def _row(self, op: str, lsn: LSN, data: bytes) -> Change | None:
        """Insert, Update or Delete in any context, every field checked."""
        subxid, relation_id, pos = self._header(data, op)
        # inside a stream block, the transaction's own descriptions come first
        stream_xid = self._stream_xid
        overlay = None if stream_xid is None else self._streams[stream_xid]
        table = self._relations.table(relation_id, op, overlay)
        if pos >= len(data):
            raise DecodeError(op, pos, "message ends before the tuple marker")
        marker = data[pos]
        old = new = None
        flags = 0
        if op != "I" and marker in (OLD_KEY, OLD_ROW):
            old, pos = table.parse(data, pos + 1, op)
            if marker == OLD_KEY:
                flags = FLAG_OLD_IS_KEY
            if op == "U":
                if len(old) != len(table.names):
                    raise _column_count(op, table, len(old))
                if pos >= len(data):
                    raise DecodeError(op, pos, "message ends before the new tuple")
                marker = data[pos]
            else:
                _check_end(data, pos, op, table, old)
                return self._emit(op, table, lsn, None, old, flags, subxid)
        expected = "'K' or 'O'" if op == "D" else "'N'"
        if marker != NEW_TUPLE or op == "D":
            raise DecodeError(op, pos, f"expected {expected}, got {message_type_name(marker)!r}")
        new, pos = table.parse(data, pos + 1, op)
        _check_end(data, pos, op, table, new)
        return self._emit(op, table, lsn, new, old, flags, subxid)

    def _on_truncate(self, lsn: LSN, data: bytes) -> list[Event] | None:
        stream_xid = self._stream_xid
        message = self._parse(data, in_stream=stream_xid is not None)
        assert isinstance(message, TruncateMessage)
        subxid = message.xid or 0
        overlay = None if stream_xid is None else self._streams[stream_xid]
        tables = [self._relations.table(oid, "T", overlay) for oid in message.relation_ids]
        out: list[Event] = []
        for table in tables:
            change = self._emit("T", table, lsn, None, None, message.flags & 3, subxid)
            if change is not None:
                out.append(change)
        return out or None

    def _on_message(self, lsn: LSN, data: bytes) -> LogicalMessage | None:
        in_stream = self._stream_xid is not None
        message = self._parse(data, in_stream=in_stream)
        assert isinstance(message, LogicalDecodingMessage)
        if not message.transactional:
            return LogicalMessage(message.lsn, False, message.prefix, message.content)
        txn = self._txn
        if txn is not None and not in_stream:
            seq = self._seq
            self._seq = seq + 1
            return LogicalMessage(message.lsn, True, message.prefix, message.content, txn, seq)
        item: Pending = ("M", None, message.lsn, message.prefix, message.content, 1)
        self._pend("M", item, message.xid or 0)
        return None


def _check_end(data: bytes, pos: int, mtype: str, table: TableInfo, values: list[Any]) -> None:
    if pos != len(data):
        raise DecodeError(mtype, pos, f"{len(data) - pos} unexpected bytes after the tuple")
    if len(values) != len(table.names):
        raise _column_count(mtype, table, len(values))


def _column_count(mtype: str, table: TableInfo, count: int) -> DecodeError:
    return DecodeError(
        mtype,
        0,
        f"tuple has {count} columns, the Relation message for {table.schema}.{table.table} "
        f"(OID {table.relation_id}) described {len(table.names)}",
    )
