"""The streamed (protocol 2) and two-phase (protocol 3) transactions of a ``PgOutputStream``:
their changes wait in its buffer until Stream Commit or COMMIT PREPARED, in place of their
transaction, and are dropped on abort or ROLLBACK PREPARED (a sub-transaction's alone); the
Relation messages a streamed transaction sends count from its commit."""

from __future__ import annotations

import datetime as dt
from collections.abc import Hashable
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import (
    Change,
    InMemoryTransactionBuffer,
    LogicalMessage,
    PgOutputStream,
    TransactionBegin,
    TransactionCommit,
)
from airflow_pglogrepl.pgoutput.changes import Event
from airflow_pglogrepl.pgoutput.messages import (
    BeginPrepareMessage,
    CommitPreparedMessage,
    InsertMessage,
    LogicalDecodingMessage,
    PrepareMessage,
    RollbackPreparedMessage,
    StreamAbortMessage,
    StreamCommitMessage,
    StreamPrepareMessage,
    StreamStartMessage,
    StreamStopMessage,
    TruncateMessage,
)
from airflow_pglogrepl.pgoutput.values import OID
from tests.support.pgoutput_encoder import ACCOUNTS, T0, Session, relation

T1 = T0 + dt.timedelta(seconds=1)
T2 = T0 + dt.timedelta(seconds=2)


def decode(session: Session, **options: Any) -> list[Event]:
    return list(PgOutputStream(**options).decode(session.rows))


# -- streamed transactions (protocol 2) -------------------------------------------------------


def _streamed(s: Session, xid: int, *messages: Any, first: bool = True) -> Session:
    return s.add(StreamStartMessage(xid, first), *messages, StreamStopMessage())


def test_streamed_transaction_is_delivered_at_stream_commit() -> None:
    s = Session().add(ACCOUNTS)
    _streamed(s, 800, InsertMessage(800, 16384, (b"1", None, None)))
    s.begin(801, 0x500).insert(16384, b"9", None, None).commit(0x500, 0x510)  # interleaved
    _streamed(s, 800, InsertMessage(800, 16384, (b"2", None, None)), first=False)
    s.add(StreamCommitMessage(800, 0, LSN(0x600), LSN(0x630), T1))
    stream = PgOutputStream(proto_version=2)
    events = []
    for row in s.rows:
        events.append(list(stream.decode([row])))
        if len(events) == 3:
            assert stream.open_streamed_xids == [800]
    flat = [e for batch in events for e in batch]
    ids = [(e.xid, e.seq, e.new["id"]) for e in flat if isinstance(e, Change) and e.new]
    assert ids == [(801, 0, 9), (800, 0, 1), (800, 1, 2)]
    assert flat[-1] == TransactionCommit(800, LSN(0x600), LSN(0x630), T1, 2)
    streamed = [e for e in flat if isinstance(e, Change) and e.xid == 800]
    assert all(c.commit_lsn == LSN(0x600) and c.commit_ts == T1 for c in streamed)
    assert streamed[0].lsn == s.rows[2][0]  # each change keeps its own WAL position
    assert stream.open_streamed_xids == []


def test_aborted_streamed_transaction_is_dropped() -> None:
    s = Session().add(ACCOUNTS)
    _streamed(s, 800, InsertMessage(800, 16384, (b"1", None, None)))
    s.add(StreamAbortMessage(800, 800))
    s.begin(801, 0x500).insert(16384, b"9", None, None).commit(0x500, 0x510)
    assert [e.new for e in decode(s, proto_version=2) if isinstance(e, Change)] == [
        {"id": 9, "owner": None, "balance": None}
    ]


def test_subtransaction_abort_drops_it_and_what_followed_it() -> None:
    def row(xid: int, key: int) -> InsertMessage:
        return InsertMessage(xid, 16384, (str(key).encode(), None, None))

    s = Session().add(ACCOUNTS)
    # top 800; savepoint a (801) with a nested savepoint b (802); b released into a; a rolled
    # back; then top-level continues, and savepoint c (803) commits with the top
    _streamed(s, 800, row(800, 1), row(801, 2), row(802, 3))
    _streamed(s, 800, row(801, 4), first=False)
    s.add(StreamAbortMessage(800, 802), StreamAbortMessage(800, 801))
    _streamed(s, 800, row(800, 5), row(803, 6), first=False)
    s.add(StreamAbortMessage(800, 999))  # a sub-transaction that changed nothing
    s.add(StreamCommitMessage(800, 0, LSN(0x600), LSN(0x630), T1))
    events = decode(s, proto_version=2)
    assert [e.new["id"] for e in events if isinstance(e, Change) and e.new] == [1, 5, 6]
    assert [e.seq for e in events if isinstance(e, Change)] == [0, 1, 2]


def test_v4_parallel_stream_abort() -> None:
    s = Session().add(ACCOUNTS)
    _streamed(s, 800, InsertMessage(800, 16384, (b"1", None, None)))
    s.add(StreamAbortMessage(800, 800, LSN(0x700), T2))
    assert decode(s, proto_version=4, abort_info=True) == []


def test_relations_described_inside_a_stream_count_from_its_commit() -> None:
    columns = [("id", OID.INT4, True), ("owner", OID.TEXT), ("balance", OID.NUMERIC)]
    wider_in_stream = relation(16384, "accounts", [*columns, ("extra", OID.INT4)], xid=800)
    s = Session().add(ACCOUNTS)
    _streamed(s, 800, wider_in_stream, InsertMessage(800, 16384, (b"1", None, None, b"5")))
    # a concurrent ordinary transaction still has the old description of the table
    s.begin(801, 0x500).insert(16384, b"9", None, None).commit(0x500, 0x510)
    s.add(StreamCommitMessage(800, 0, LSN(0x600), LSN(0x630), T1))
    s.begin(802, 0x700).insert(16384, b"10", None, None, b"6").commit(0x700, 0x710)
    news = [e.new for e in decode(s, proto_version=2) if isinstance(e, Change)]
    assert news == [
        {"id": 9, "owner": None, "balance": None},
        {"id": 1, "owner": None, "balance": None, "extra": 5},
        {"id": 10, "owner": None, "balance": None, "extra": 6},
    ]


def test_streamed_messages_and_truncates_wait_for_the_commit() -> None:
    s = Session().add(ACCOUNTS)
    _streamed(
        s,
        800,
        LogicalDecodingMessage(800, 1, LSN(0x44), "p", b"in stream"),
        TruncateMessage(801, 1, (16384,)),
        LogicalDecodingMessage(800, 0, LSN(0x45), "p", b"now"),
    )
    stream = PgOutputStream(proto_version=2)
    early = list(stream.decode(s.rows))
    assert early == [LogicalMessage(LSN(0x45), False, "p", b"now")]
    late = stream.feed(LSN(0x9999), _encode(StreamCommitMessage(800, 0, LSN(0x60), LSN(0x63), T1)))
    begin = TransactionBegin(800, LSN(0x60), T1)
    assert late[0] == begin and late[1] == LogicalMessage(
        LSN(0x44), True, "p", b"in stream", begin, 0
    )
    truncate = late[2]
    assert isinstance(truncate, Change) and truncate.op == "T" and truncate.cascade
    assert truncate.seq == 1


def _encode(message: Any) -> bytes:
    from tests.support.pgoutput_encoder import encode

    return encode(message)


# -- two-phase transactions (protocol 3) ------------------------------------------------------


def _prepared(s: Session, xid: int, gid: str, *messages: Any) -> Session:
    s.add(BeginPrepareMessage(LSN(0x300), LSN(0x340), T0, xid, gid), *messages)
    return s.add(PrepareMessage(0, LSN(0x300), LSN(0x340), T0, xid, gid))


def test_prepared_transaction_waits_for_commit_prepared() -> None:
    s = Session().add(ACCOUNTS)
    _prepared(s, 900, "tx-1", InsertMessage(None, 16384, (b"1", None, None)))
    stream = PgOutputStream(proto_version=3)
    assert list(stream.decode(s.rows)) == []
    assert stream.prepared_gids == ["tx-1"] and stream.oldest_pending_lsn == LSN(0x300)
    done = stream.feed(
        LSN(0x9000), _encode(CommitPreparedMessage(0, LSN(0x800), LSN(0x830), T2, 900, "tx-1"))
    )
    begin = TransactionBegin(900, LSN(0x800), T2, "tx-1")
    assert done[0] == begin
    assert isinstance(done[1], Change) and done[1].transaction == begin and done[1].seq == 0
    assert done[2] == TransactionCommit(900, LSN(0x800), LSN(0x830), T2, 1, "tx-1")
    assert stream.prepared_gids == [] and stream.oldest_pending_lsn is None


def test_rolled_back_prepared_transaction_is_dropped() -> None:
    s = Session().add(ACCOUNTS)
    _prepared(s, 900, "tx-1", InsertMessage(None, 16384, (b"1", None, None)))
    s.add(RollbackPreparedMessage(0, LSN(0x340), LSN(0x900), T0, T1, 900, "tx-1"))
    s.add(RollbackPreparedMessage(0, LSN(0x340), LSN(0x900), T0, T1, 901, "unknown"))
    assert decode(s, proto_version=3) == []


def test_streamed_then_prepared_transaction() -> None:
    s = Session().add(ACCOUNTS)
    _streamed(s, 800, InsertMessage(800, 16384, (b"1", None, None)))
    s.add(StreamPrepareMessage(0, LSN(0x300), LSN(0x340), T0, 800, "big"))
    s.add(CommitPreparedMessage(0, LSN(0x800), LSN(0x830), T2, 800, "big"))
    events = decode(s, proto_version=3)
    assert [type(e).__name__ for e in events] == ["TransactionBegin", "Change", "TransactionCommit"]
    assert events[0] == TransactionBegin(800, LSN(0x800), T2, "big")


def test_prepare_must_match_its_begin_prepare() -> None:
    s = Session().add(BeginPrepareMessage(LSN(0x300), LSN(0x340), T0, 900, "a"))
    s.add(PrepareMessage(0, LSN(0x300), LSN(0x340), T0, 900, "b"))
    with pytest.raises(DecodeError, match="without its Begin Prepare"):
        decode(s, proto_version=3)


# -- the buffer interface ---------------------------------------------------------------------


class RecordingBuffer(InMemoryTransactionBuffer):
    """Counts what passes through, to show the stream keeps nothing pending elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.appended: list[Hashable] = []

    def append(self, key: Hashable, subxid: int, item: Any) -> None:
        self.appended.append(key)
        super().append(key, subxid, item)


def test_streamed_and_prepared_changes_wait_in_the_given_buffer() -> None:
    buffer = RecordingBuffer()
    s = Session().add(ACCOUNTS)
    _streamed(s, 800, InsertMessage(800, 16384, (b"1", None, None)))
    _prepared(s, 900, "g", InsertMessage(None, 16384, (b"2", None, None)))
    s.begin(1, 0x100).insert(16384, b"3", None, None).commit(0x100, 0x110)
    stream = PgOutputStream(proto_version=3, buffer=buffer)
    list(stream.decode(s.rows))
    assert buffer.appended == [("stream", 800), ("prepared", "g")]
    assert sorted(map(str, buffer.keys())) == ["('prepared', 'g')", "('stream', 800)"]
    assert buffer.total_items() == 2
