"""PgOutputStream: the relation cache, transactions, streamed and prepared transaction assembly."""

from __future__ import annotations

import datetime as dt
import pickle
from collections.abc import Hashable, Sequence
from decimal import Decimal
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import DecodeError, UnknownRelationError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import (
    UNCHANGED_TOAST,
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
    Binary,
    CommitPreparedMessage,
    DeleteMessage,
    InsertMessage,
    LogicalDecodingMessage,
    OriginMessage,
    PrepareMessage,
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
from airflow_pglogrepl.pgoutput.values import OID
from tests.support.pgoutput_encoder import T0, Session, relation, u16, u32

T1 = T0 + dt.timedelta(seconds=1)
T2 = T0 + dt.timedelta(seconds=2)

ACCOUNTS = relation(
    16384,
    "accounts",
    [
        ("id", OID.INT4, True),
        ("owner", OID.TEXT),
        ("balance", OID.NUMERIC, False, (10 << 16 | 2) + 4),
    ],
)
NOTES = relation(16390, "notes", [("k", OID.TEXT, True), ("body", OID.TEXT)], identity="f")


def decode(session: Session, **options: Any) -> list[Event]:
    return list(PgOutputStream(**options).decode(session.rows))


def changes(events: Sequence[Event]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events if isinstance(e, Change)]


def only_changes(events: Sequence[Event]) -> list[tuple[str, Any, Any]]:
    return [(e.op, e.old, e.new) for e in events if isinstance(e, Change)]


# -- ordinary transactions --------------------------------------------------------------------


def test_one_transaction_of_every_change_kind() -> None:
    s = Session().add(ACCOUNTS, NOTES).begin(700, 0x9000)
    s.insert(16384, b"1", b"ann", b"10.50")
    s.add(UpdateMessage(None, 16384, None, None, (b"1", b"ann", b"11.00")))
    s.add(UpdateMessage(None, 16384, "K", (b"1", None, None), (b"2", b"ann", b"11.00")))
    s.add(UpdateMessage(None, 16390, "O", (b"a", b"x"), (b"a", UNCHANGED_TOAST)))
    s.add(DeleteMessage(None, 16384, "K", (b"2", None, None)))
    s.add(DeleteMessage(None, 16390, "O", (b"a", None)))
    s.add(TruncateMessage(None, 3, (16384, 16390)))
    s.add(LogicalDecodingMessage(None, 1, LSN(0x8000), "app", b"note"))
    s.commit(0x9000, 0x9030)
    events = decode(s)

    begin = TransactionBegin(700, LSN(0x9000), T0)
    assert events[0] == begin
    assert events[-1] == TransactionCommit(700, LSN(0x9000), LSN(0x9030), T0, 9)
    lsns = [row[0] for row in s.rows[3:12]]
    accounts, notes = ("public", "accounts"), ("public", "notes")

    def row(seq: int, op: str, rel: tuple[str, str], old: Any, new: Any, **extra: Any) -> Any:
        return {
            "op": op,
            "relation": rel,
            "xid": 700,
            "lsn": lsns[min(seq, 6)],  # one Truncate message, two tables
            "seq": seq,
            "commit_lsn": LSN(0x9000),
            "commit_ts": T0,
            "old": old,
            "new": new,
            "unchanged_toast": frozenset(),
            "cascade": False,
            "restart_identity": False,
            **extra,
        }

    row1 = {"id": 1, "owner": "ann", "balance": Decimal("10.50")}
    row1b = {"id": 1, "owner": "ann", "balance": Decimal("11.00")}
    row2 = {"id": 2, "owner": "ann", "balance": Decimal("11.00")}
    truncated = {"cascade": True, "restart_identity": True}
    assert changes(events) == [
        row(0, "I", accounts, None, row1),
        row(1, "U", accounts, None, row1b),
        row(2, "U", accounts, {"id": 1}, row2),
        row(3, "U", notes, {"k": "a", "body": "x"}, {"k": "a"}, unchanged_toast={"body"}),
        row(4, "D", accounts, {"id": 2}, None),
        row(5, "D", notes, {"k": "a", "body": None}, None),
        row(6, "T", accounts, None, None, **truncated),
        row(7, "T", notes, None, None, **truncated),
    ]
    message = events[-2]
    assert message == LogicalMessage(LSN(0x8000), True, "app", b"note", begin, 8)
    assert message.xid == 700 if isinstance(message, LogicalMessage) else False


def test_changes_pass_through_as_they_come() -> None:
    stream = PgOutputStream()
    s = Session().add(ACCOUNTS).begin(1, 0x100).insert(16384, b"1", None, None)
    first = [stream.feed(lsn, data) for lsn, _, data in s.rows]
    assert [len(f) for f in first] == [0, 1, 1]
    assert isinstance(first[2][0], Change) and first[2][0].new == {"id": 1, "owner": None,
                                                                     "balance": None}  # fmt: skip
    assert stream.in_transaction


def test_unchanged_toast_is_not_null() -> None:
    s = Session().add(NOTES).begin(1, 0x100)
    s.add(UpdateMessage(None, 16390, None, None, (b"a", UNCHANGED_TOAST)))
    s.add(UpdateMessage(None, 16390, None, None, (b"b", None))).commit(0x100, 0x110)
    toast, null = [e for e in decode(s) if isinstance(e, Change)]
    assert toast.new == {"k": "a"} and toast.unchanged_toast == {"body"}
    assert null.new == {"k": "b", "body": None} and null.unchanged_toast == frozenset()
    assert toast.raw_new == [b"a", UNCHANGED_TOAST]


def test_non_transactional_message_is_delivered_alone() -> None:
    s = Session().add(LogicalDecodingMessage(None, 0, LSN(0x50), "audit", b"\x00\x01"))
    assert decode(s) == [LogicalMessage(LSN(0x50), False, "audit", b"\x00\x01")]


def test_origin_is_reported_on_commit() -> None:
    s = Session().begin(5, 0x100).add(OriginMessage(LSN(0x77), "upstream")).commit(0x100, 0x120)
    assert decode(s)[-1] == TransactionCommit(5, LSN(0x100), LSN(0x120), T0, 0, None, "upstream")


def test_domain_columns_convert_as_their_base_type_and_enums_stay_text() -> None:
    s = Session().add(
        TypeMessage(None, 16500, "pg_catalog", "int4"),
        TypeMessage(None, 16510, "public", "mood"),
        relation(16520, "t", [("qty", 16500), ("mood", 16510), ("tags", 1009)]),
    )
    s.begin(1, 0x100).insert(16520, b"42", b"happy", b'{a,"b c"}').commit(0x100, 0x110)
    (change,) = [e for e in decode(s) if isinstance(e, Change)]
    assert change.new == {"qty": 42, "mood": "happy", "tags": ["a", "b c"]}
    assert [c.type_name for c in change.table.columns] == ["pg_catalog.int4", "public.mood", None]
    assert [c.value_type_oid for c in change.table.columns] == [OID.INT4, None, 1009]


def test_changes_keep_the_table_version_they_were_decoded_with() -> None:
    before = relation(16384, "t", [("a", OID.INT4)])
    after = relation(16384, "t", [("a", OID.INT4), ("b", OID.TEXT)])
    s = Session().add(before).begin(1, 0x100).insert(16384, b"1")
    s.add(after).insert(16384, b"2", b"x").commit(0x100, 0x110)
    old, new = [e for e in decode(s) if isinstance(e, Change)]
    assert old.new == {"a": 1} and new.new == {"a": 2, "b": "x"}
    assert old.table.names == ("a",) and new.table.names == ("a", "b")


def test_binary_columns() -> None:
    s = Session().add(ACCOUNTS).begin(1, 0x100)
    s.insert(16384, Binary(b"\x00\x00\x00\x07"), b"text col", None).commit(0x100, 0x110)
    (change,) = [e for e in decode(s) if isinstance(e, Change)]
    assert change.new == {"id": 7, "owner": "text col", "balance": None}


def test_conversion_errors_name_the_column() -> None:
    s = Session().add(ACCOUNTS).begin(1, 0x100).insert(16384, b"one", b"x", None)
    (change,) = [e for e in decode(s) if isinstance(e, Change)]
    with pytest.raises(DecodeError, match=r"column 'id' of public\.accounts") as info:
        _ = change.new
    assert info.value.message_type == "I"


def test_change_survives_pickling() -> None:
    s = Session().add(ACCOUNTS).begin(1, 0x100).insert(16384, b"1", b"a", b"2.50")
    (change,) = [e for e in decode(s) if isinstance(e, Change)]
    copy = pickle.loads(pickle.dumps(change))
    assert copy == change and copy.new == {"id": 1, "owner": "a", "balance": Decimal("2.50")}
    assert copy.table == change.table


def test_change_repr_is_readable() -> None:
    s = Session().add(ACCOUNTS).begin(1, 0x100).insert(16384, b"1", b"a", None)
    (change,) = [e for e in decode(s) if isinstance(e, Change)]
    assert repr(change).startswith("Change(I public.accounts, xid=1, lsn=0/1030, seq=0, new={")


# -- errors -----------------------------------------------------------------------------------


def test_data_for_an_undescribed_relation() -> None:
    s = Session().begin(1, 0x100).insert(99, b"1")
    with pytest.raises(UnknownRelationError) as info:
        decode(s)
    assert info.value.relation_id == 99 and info.value.message_type == "I"
    assert "pgoutput row at LSN 0/1020" in info.value.__notes__


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: s.commit(0x100, 0x110), "Commit without Begin"),
        (lambda s: s.begin(1, 0x100).begin(2, 0x200), "while another is still open"),
        (lambda s: s.add(ACCOUNTS).insert(16384, b"1", None, None), "outside a transaction"),
        (lambda s: s.begin(1, 0x100).commit(0x200, 0x210), "differs from Begin's"),
        (lambda s: s.add(StreamStopMessage()), "Stream Stop without Stream Start"),
        (lambda s: s.add(StreamStartMessage(5, False)), "whose first block"),
        (lambda s: s.add(StreamStartMessage(5, True), StreamStartMessage(5, True)), "inside an"),
        (lambda s: s.add(StreamCommitMessage(9, 0, LSN(1), LSN(2), T0)), "no streamed transact"),
        (lambda s: s.add(StreamStartMessage(5, True)).begin(1, 0x100), "inside a stream block"),
        (lambda s: s.add(ACCOUNTS).begin(1, 0x100).insert(16384, b"1"), "tuple has 1 columns"),
        (
            lambda s: s.add(ACCOUNTS).begin(1, 0x100).raw(b"I" + u32(16384) + b"N" + u16(3) + b"n"),
            "tuple data ends inside column 1",
        ),
        (lambda s: s.raw(b"Z"), "unknown pgoutput message type"),
        (lambda s: s.raw(b""), "empty message"),
        (
            lambda s: s.add(CommitPreparedMessage(0, LSN(1), LSN(2), T0, 3, "gone")),
            "did not see",
        ),
    ],
)  # fmt: skip
def test_protocol_violations(build: Any, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(build(Session()), proto_version=3)


def test_message_types_above_the_stream_version() -> None:
    with pytest.raises(DecodeError, match="needs proto_version 2, the stream was created for 1"):
        decode(Session().add(StreamStopMessage()))


def test_text_rows_are_refused_with_a_pointer() -> None:
    with pytest.raises(TypeError, match="pgoutput slots only"):
        list(PgOutputStream().decode([(LSN(1), 1, "BEGIN 1")]))


def test_options() -> None:
    assert PgOutputStream.from_options({"proto_version": "4", "streaming": "parallel"}).abort_info
    stream = PgOutputStream.from_options({"proto_version": "2", "streaming": "on"})
    assert stream.proto_version == 2 and not stream.abort_info
    with pytest.raises(ValueError, match="needs proto_version 4"):
        PgOutputStream(proto_version=3, abort_info=True)
    with pytest.raises(ValueError, match="proto_version 0 is not supported"):
        PgOutputStream(proto_version=0)


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


def test_in_memory_buffer_subtransaction_rules() -> None:
    buffer = InMemoryTransactionBuffer()
    for sub, item in [(1, "a"), (2, "b"), (3, "c"), (2, "d"), (4, "e")]:
        buffer.append("t", sub, item)
    buffer.abort_subtransaction("t", 3)
    assert list(buffer.pop("t")) == ["a", "b"]
    buffer.open("empty")
    assert "empty" in buffer and list(buffer.pop("empty")) == []
    buffer.abort_subtransaction("missing", 1)
    buffer.discard("missing")
    assert buffer.keys() == []
