"""The streamed and two-phase transactions of a ``PgOutputStream``: changes that must wait.

A streamed transaction (protocol 2, ``streaming 'on'``) is sent in blocks while it runs, before
anyone knows whether it commits; a two-phase one (protocol 3, ``two_phase 'on'``) is sent at its
PREPARE, before its COMMIT PREPARED or ROLLBACK PREPARED. Their changes wait in the stream's
``TransactionBuffer`` and come out only once the transaction's outcome is known. The messages
that open, close, deliver and drop them are handled here, apart from the ordinary traffic the
stream passes straight through: ``PgOutputStream`` inherits these handlers and registers them
for the protocol version it reads, and holds the state they share.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.buffer import Prepared, TransactionBuffer, deliver
from airflow_pglogrepl.pgoutput.changes import Event, TransactionBegin
from airflow_pglogrepl.pgoutput.messages import (
    BeginPrepareMessage,
    CommitPreparedMessage,
    PgOutputMessage,
    PrepareMessage,
    RollbackPreparedMessage,
    StreamAbortMessage,
    StreamCommitMessage,
    StreamPrepareMessage,
    StreamStartMessage,
)
from airflow_pglogrepl.pgoutput.relations import RelationCache
from airflow_pglogrepl.pgoutput.table_info import TableInfo

__all__ = ["WaitingTransactionsMixin"]


class WaitingTransactionsMixin:
    """``PgOutputStream``'s handlers of the messages that open, deliver and drop the streamed
    and prepared transactions waiting in its buffer (Stream Start/Stop/Commit/Abort/Prepare,
    Begin Prepare, Prepare, COMMIT PREPARED, ROLLBACK PREPARED)."""

    # The stream's state, set by PgOutputStream.__init__ and shared with its other handlers.
    _buffer: TransactionBuffer
    _relations: RelationCache
    _txn: TransactionBegin | None
    _origin: str | None
    # a two-phase transaction between Begin Prepare and Prepare, and the prepared ones waiting
    # for COMMIT or ROLLBACK PREPARED
    _preparing: BeginPrepareMessage | None
    _prepared: dict[str, Prepared]
    # the streamed transaction whose block is open, and every open streamed transaction's own
    # Relation messages (applied to the cache when it commits)
    _stream_xid: int | None
    _streams: dict[int, dict[int, TableInfo]]

    if TYPE_CHECKING:  # PgOutputStream's

        def _parse(self, data: bytes, in_stream: bool = False) -> PgOutputMessage: ...

        def _require_idle(self, mtype: str) -> None: ...

    # -- two-phase transactions -----------------------------------------------------------

    def _on_begin_prepare(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data)
        assert isinstance(message, BeginPrepareMessage)
        self._require_idle("b")
        if message.gid in self._prepared:
            raise DecodeError("b", 0, f"transaction {message.gid!r} is already prepared")
        self._preparing = message
        self._origin = None
        self._buffer.open(("prepared", message.gid))

    def _on_prepare(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data)
        assert isinstance(message, PrepareMessage)
        begin = self._preparing
        if begin is None or begin.gid != message.gid or begin.xid != message.xid:
            raise DecodeError("P", 0, f"Prepare of {message.gid!r} without its Begin Prepare")
        self._preparing = None
        self._prepared[message.gid] = Prepared(
            message.xid, message.gid, message.prepare_lsn, message.end_lsn, self._origin
        )

    def _on_commit_prepared(self, lsn: LSN, data: bytes) -> Iterator[Event]:
        message = self._parse(data)
        assert isinstance(message, CommitPreparedMessage)
        self._require_idle("K")
        prepared = self._prepared.pop(message.gid, None)
        if prepared is None:
            raise DecodeError(
                "K",
                0,
                f"COMMIT PREPARED {message.gid!r} (xid {message.xid}) for a transaction whose "
                f"PREPARE this decoding session did not see: its changes were delivered before. "
                f"Never advance a two-phase slot past a prepared transaction that is still open",
            )
        items = self._buffer.pop(("prepared", message.gid))
        begin = TransactionBegin(message.xid, message.commit_lsn, message.commit_ts, message.gid)
        return deliver(begin, items, message.end_lsn, prepared.origin)

    def _on_rollback_prepared(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data)
        assert isinstance(message, RollbackPreparedMessage)
        self._require_idle("r")
        self._prepared.pop(message.gid, None)
        self._buffer.discard(("prepared", message.gid))

    # -- streaming ------------------------------------------------------------------------

    def _on_stream_start(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data)
        assert isinstance(message, StreamStartMessage)
        if self._stream_xid is not None:
            raise DecodeError("S", 0, "Stream Start inside an open stream block")
        if self._txn is not None or self._preparing is not None:
            raise DecodeError("S", 0, "Stream Start inside a transaction")
        xid = message.xid
        if message.first_segment:
            if xid in self._streams:
                raise DecodeError("S", 1, f"first stream block of xid {xid} seen twice")
            self._streams[xid] = {}
            self._buffer.open(("stream", xid))
        elif xid not in self._streams:
            raise DecodeError(
                "S",
                1,
                f"stream block of xid {xid} continues a transaction whose first block this "
                f"session did not see; decode from the slot's start position",
            )
        self._stream_xid = xid

    def _on_stream_stop(self, lsn: LSN, data: bytes) -> None:
        self._parse(data)
        if self._stream_xid is None:
            raise DecodeError("E", 0, "Stream Stop without Stream Start")
        self._stream_xid = None

    def _closed_stream(self, mtype: str, xid: int) -> dict[int, TableInfo]:
        if self._stream_xid is not None:
            raise DecodeError(mtype, 0, "arrived inside a stream block (no Stream Stop)")
        overlay = self._streams.pop(xid, None)
        if overlay is None:
            raise DecodeError(mtype, 1, f"no streamed transaction {xid} is open")
        return overlay

    def _on_stream_commit(self, lsn: LSN, data: bytes) -> Iterator[Event]:
        message = self._parse(data)
        assert isinstance(message, StreamCommitMessage)
        for table in self._closed_stream("c", message.xid).values():
            self._relations.describe(table)
        items = self._buffer.pop(("stream", message.xid))
        begin = TransactionBegin(message.xid, message.commit_lsn, message.commit_ts)
        return deliver(begin, items, message.end_lsn, None)

    def _on_stream_abort(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data)
        assert isinstance(message, StreamAbortMessage)
        if self._stream_xid is not None:
            raise DecodeError("A", 0, "arrived inside a stream block (no Stream Stop)")
        if message.xid not in self._streams:
            return  # nothing of it was kept
        if message.subxid == message.xid:
            del self._streams[message.xid]
            self._buffer.discard(("stream", message.xid))
        else:
            self._buffer.abort_subtransaction(("stream", message.xid), message.subxid)

    def _on_stream_prepare(self, lsn: LSN, data: bytes) -> None:
        message = self._parse(data)
        assert isinstance(message, StreamPrepareMessage)
        for table in self._closed_stream("p", message.xid).values():
            self._relations.describe(table)
        if message.gid in self._prepared:
            raise DecodeError("p", 0, f"transaction {message.gid!r} is already prepared")
        self._buffer.rename(("stream", message.xid), ("prepared", message.gid))
        self._prepared[message.gid] = Prepared(
            message.xid, message.gid, message.prepare_lsn, message.end_lsn, None
        )
