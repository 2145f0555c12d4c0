"""pgoutput messages, one per test: byte buffers spelled out field by field, whole records compared.

The "captured" buffers are real PostgreSQL 15 output (pg_logical_slot_peek_binary_changes); the
others are built from the documented layout with the small helpers of ``pgoutput_encoder``.

Property tests: any message encodes and decodes back to itself; any damage is a DecodeError.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_pglogrepl.exceptions import DecodeError
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
    MessageType,
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
from airflow_pglogrepl.pgoutput.parser import decode_message
from tests.support.pgoutput_encoder import cstr, encode, i32, ts, u8, u16, u32, u64

T1 = dt.datetime(2026, 11, 22, 5, 10, 25, 790058, tzinfo=dt.UTC)
T2 = dt.datetime(2026, 11, 22, 5, 10, 25, 790841, tzinfo=dt.UTC)
T3 = dt.datetime(2026, 11, 22, 5, 10, 25, 791019, tzinfo=dt.UTC)


# -- captured from PostgreSQL 15 --------------------------------------------------------------


def test_captured_begin() -> None:
    data = b"B\x00\x00\x00\x00\x01P]\xa8\x00\x03\x03\xd5C\x84@j\x00\x00\x02\xd7"
    assert decode_message(data) == BeginMessage(LSN("0/1505DA8"), T1, 727)


def test_captured_relation() -> None:
    data = (
        b"R\x00\x00@\x00public\x00t\x00d\x00\x03\x01id\x00\x00\x00\x00\x17\xff\xff\xff\xff"
        b"\x00v\x00\x00\x00\x00\x19\xff\xff\xff\xff\x00b\x00\x00\x00\x00\x10\xff\xff\xff\xff"
    )
    assert decode_message(data) == RelationMessage(
        None,
        16384,
        "public",
        "t",
        "d",
        (
            RelationColumn(1, "id", 23, -1),
            RelationColumn(0, "v", 25, -1),
            RelationColumn(0, "b", 16, -1),
        ),
    )


def test_captured_insert() -> None:
    data = b"I\x00\x00@\x00N\x00\x03t\x00\x00\x00\x011t\x00\x00\x00\x03a'bt\x00\x00\x00\x01t"
    assert decode_message(data) == InsertMessage(None, 16384, (b"1", b"a'b", b"t"))


def test_captured_commit() -> None:
    data = b"C\x00\x00\x00\x00\x00\x01P]\xa8\x00\x00\x00\x00\x01P]\xd8\x00\x03\x03\xd5C\x84@j"
    assert decode_message(data) == CommitMessage(0, LSN("0/1505DA8"), LSN("0/1505DD8"), T1)


def test_captured_non_transactional_message() -> None:
    data = b"M\x00\x00\x00\x00\x00\x01P^\x18pfx\x00\x00\x00\x00\x05hello"
    message = decode_message(data)
    assert message == LogicalDecodingMessage(None, 0, LSN("0/1505E18"), "pfx", b"hello")
    assert isinstance(message, LogicalDecodingMessage)
    assert not message.transactional


def test_captured_two_phase() -> None:
    begin = (
        b"b\x00\x00\x00\x00\x01P^\x98\x00\x00\x00\x00\x01P_\x90\x00\x03\x03\xd5C\x84Cy"
        b"\x00\x00\x02\xd8g1\x00"
    )
    prepare = b"P\x00" + begin[1:]
    commit = (
        b"K\x00\x00\x00\x00\x00\x01P_\x90\x00\x00\x00\x00\x01P_\xc8\x00\x03\x03\xd5C\x84D+"
        b"\x00\x00\x02\xd8g1\x00"
    )
    lsns = LSN("0/1505E98"), LSN("0/1505F90")
    assert decode_message(begin, proto_version=3) == BeginPrepareMessage(*lsns, T2, 728, "g1")
    assert decode_message(prepare, proto_version=3) == PrepareMessage(0, *lsns, T2, 728, "g1")
    assert decode_message(commit, proto_version=3) == CommitPreparedMessage(
        0, LSN("0/1505F90"), LSN("0/1505FC8"), T3, 728, "g1"
    )


# -- protocol 1 -------------------------------------------------------------------------------


def test_origin() -> None:
    data = b"O" + u64(0x1_0000_0020) + cstr("node_a")
    assert decode_message(data) == OriginMessage(LSN("1/20"), "node_a")


def test_relation_empty_namespace_is_pg_catalog_and_typmod_is_signed() -> None:
    data = (
        b"R" + u32(1259) + cstr("") + cstr("pg_class") + b"f" + u16(1)
        + u8(1) + cstr("n") + u32(1700) + i32(655366)
    )  # fmt: skip
    assert decode_message(data) == RelationMessage(
        None, 1259, "pg_catalog", "pg_class", "f", (RelationColumn(1, "n", 1700, 655366),)
    )


def test_relation_column_key_flag() -> None:
    assert RelationColumn(1, "k", 23, -1).is_key
    assert not RelationColumn(0, "v", 23, -1).is_key


def test_type() -> None:
    data = b"Y" + u32(16390) + cstr("public") + cstr("mood")
    assert decode_message(data) == TypeMessage(None, 16390, "public", "mood")


def test_insert_every_tuple_kind() -> None:
    data = (
        b"I" + u32(7) + b"N" + u16(4)
        + b"n" + b"u" + b"t" + u32(2) + b"hi" + b"b" + u32(4) + b"\x00\x00\x00\x2a"
    )  # fmt: skip
    message = decode_message(data)
    assert message == InsertMessage(None, 7, (None, UNCHANGED_TOAST, b"hi", Binary(b"\0\0\0*")))
    assert isinstance(message, InsertMessage)
    assert isinstance(message.new[3], Binary)
    assert message.new[1] is UNCHANGED_TOAST and message.new[1] is not None


def test_update_without_old_tuple() -> None:
    data = b"U" + u32(7) + b"N" + u16(1) + b"t" + u32(1) + b"x"
    assert decode_message(data) == UpdateMessage(None, 7, None, None, (b"x",))


@pytest.mark.parametrize("kind", ["K", "O"])
def test_update_with_old_key_or_old_tuple(kind: str) -> None:
    old = u16(2) + b"t" + u32(3) + b"Bob" + b"n"
    new = u16(2) + b"t" + u32(5) + b"Oscar" + b"u"
    data = b"U" + u32(7) + kind.encode() + old + b"N" + new
    assert decode_message(data) == UpdateMessage(
        None,
        7,
        kind,
        (b"Bob", None),
        (b"Oscar", UNCHANGED_TOAST),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("kind", ["K", "O"])
def test_delete(kind: str) -> None:
    data = b"D" + u32(7) + kind.encode() + u16(1) + b"t" + u32(1) + b"9"
    assert decode_message(data) == DeleteMessage(None, 7, kind, (b"9",))  # type: ignore[arg-type]


def test_truncate_several_relations_with_flags() -> None:
    data = b"T" + u32(2) + u8(3) + u32(16384) + u32(16390)
    message = decode_message(data)
    assert message == TruncateMessage(None, 3, (16384, 16390))
    assert isinstance(message, TruncateMessage)
    assert message.cascade and message.restart_identity
    plain = decode_message(b"T" + u32(1) + u8(0) + u32(5))
    assert isinstance(plain, TruncateMessage)
    assert not plain.cascade and not plain.restart_identity


def test_transactional_message() -> None:
    data = b"M" + u8(1) + u64(0x20) + cstr("app") + u32(3) + b"\x00\x01\x02"
    message = decode_message(data)
    assert message == LogicalDecodingMessage(None, 1, LSN(0x20), "app", b"\x00\x01\x02")
    assert isinstance(message, LogicalDecodingMessage)
    assert message.transactional


# -- protocol 2: streaming --------------------------------------------------------------------


def test_stream_start_stop() -> None:
    assert decode_message(b"S" + u32(800) + u8(1), proto_version=2) == StreamStartMessage(800, True)
    assert decode_message(b"S" + u32(800) + u8(0), proto_version=2) == StreamStartMessage(
        800, False
    )
    assert decode_message(b"E", proto_version=2) == StreamStopMessage()


def test_stream_commit() -> None:
    data = b"c" + u32(800) + u8(0) + u64(0x100) + u64(0x130) + ts(T1)
    assert decode_message(data, proto_version=2) == StreamCommitMessage(
        800, 0, LSN(0x100), LSN(0x130), T1
    )


def test_stream_abort_v2_has_no_abort_info() -> None:
    data = b"A" + u32(800) + u32(801)
    assert decode_message(data, proto_version=2) == StreamAbortMessage(800, 801)
    assert decode_message(data, proto_version=4) == StreamAbortMessage(800, 801)


def test_stream_abort_v4_parallel_carries_lsn_and_time() -> None:
    data = b"A" + u32(800) + u32(800) + u64(0x200) + ts(T2)
    assert decode_message(data, proto_version=4, abort_info=True) == StreamAbortMessage(
        800, 800, LSN(0x200), T2
    )
    with pytest.raises(DecodeError, match="unexpected bytes"):
        decode_message(data, proto_version=4)  # parallel form read as the plain one
    with pytest.raises(DecodeError, match="proto_version 4"):
        decode_message(data, proto_version=3, abort_info=True)


@pytest.mark.parametrize(
    ("in_stream_data", "record"),
    [
        (
            b"R" + u32(801) + u32(9) + cstr("s") + cstr("t") + b"i" + u16(0),
            RelationMessage(801, 9, "s", "t", "i", ()),
        ),
        (
            b"Y" + u32(801) + u32(30) + cstr("") + cstr("int4"),
            TypeMessage(801, 30, "pg_catalog", "int4"),
        ),
        (b"I" + u32(801) + u32(9) + b"N" + u16(1) + b"n", InsertMessage(801, 9, (None,))),
        (
            b"U" + u32(801) + u32(9) + b"O" + u16(1) + b"n" + b"N" + u16(1) + b"n",
            UpdateMessage(801, 9, "O", (None,), (None,)),
        ),
        (b"D" + u32(801) + u32(9) + b"K" + u16(1) + b"n", DeleteMessage(801, 9, "K", (None,))),
        (b"T" + u32(801) + u32(1) + u8(1) + u32(9), TruncateMessage(801, 1, (9,))),
        (
            b"M" + u32(801) + u8(1) + u64(5) + cstr("p") + u32(1) + b"x",
            LogicalDecodingMessage(801, 1, LSN(5), "p", b"x"),
        ),
    ],
)  # fmt: skip
def test_data_messages_inside_a_stream_start_with_the_xid(
    in_stream_data: bytes, record: object
) -> None:
    assert decode_message(in_stream_data, proto_version=2, in_stream=True) == record
    with pytest.raises(DecodeError):  # the same bytes outside a stream do not parse
        assert decode_message(in_stream_data, proto_version=2) != record


# -- protocol 3: two-phase --------------------------------------------------------------------


def test_stream_prepare() -> None:
    data = b"p" + u8(0) + u64(0x300) + u64(0x340) + ts(T1) + u32(900) + cstr("gx")
    assert decode_message(data, proto_version=3) == StreamPrepareMessage(
        0, LSN(0x300), LSN(0x340), T1, 900, "gx"
    )


def test_rollback_prepared() -> None:
    data = (
        b"r" + u8(0) + u64(0x300) + u64(0x400) + ts(T1) + ts(T2) + u32(900) + cstr("it's")
    )  # fmt: skip
    assert decode_message(data, proto_version=3) == RollbackPreparedMessage(
        0, LSN(0x300), LSN(0x400), T1, T2, 900, "it's"
    )


# -- errors -----------------------------------------------------------------------------------


def test_truncated_insert_names_type_and_offset() -> None:
    data = b"I" + u32(7) + b"N" + u16(2) + b"t" + u32(10) + b"abc"
    with pytest.raises(DecodeError) as info:
        decode_message(data)
    assert info.value.message_type == "I"
    assert info.value.offset == len(data)
    assert "column 0 claims 10 bytes, 3 remain" in str(info.value)


def test_short_fixed_fields_name_the_field() -> None:
    with pytest.raises(DecodeError) as info:
        decode_message(b"B" + u64(5) + b"\x00\x01")
    assert (info.value.message_type, info.value.offset) == ("B", 9)
    assert "commit timestamp" in info.value.reason


def test_unterminated_string() -> None:
    with pytest.raises(DecodeError, match="prefix is not NUL-terminated"):
        decode_message(b"M" + u8(0) + u64(1) + b"pfx")


def test_invalid_utf8_in_a_name() -> None:
    with pytest.raises(DecodeError, match="relation name is not UTF-8") as info:
        decode_message(b"R" + u32(1) + cstr("s") + b"\xff\x00" + b"d" + u16(0))
    assert info.value.offset == 7


def test_unknown_tuple_kind() -> None:
    with pytest.raises(DecodeError, match="column 0 has unknown kind 'x'") as info:
        decode_message(b"I" + u32(1) + b"N" + u16(1) + b"x")
    assert info.value.offset == 8


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"I" + u32(1) + b"K" + u16(0), "expected new-tuple marker 'N', got 'K'"),
        (b"U" + u32(1) + b"X" + u16(0), "expected tuple marker 'K' or 'O' or 'N'"),
        (b"D" + u32(1) + b"N" + u16(0), "expected old-tuple marker 'K' or 'O'"),
        (b"R" + u32(1) + cstr("s") + cstr("t") + b"z" + u16(0), "unknown replica identity"),
    ],
)
def test_bad_markers(data: bytes, expected: str) -> None:
    with pytest.raises(DecodeError, match=expected):
        decode_message(data)


def test_trailing_bytes_are_an_error() -> None:
    with pytest.raises(DecodeError, match="1 unexpected bytes") as info:
        decode_message(b"E!", proto_version=2)
    assert info.value.offset == 1


def test_unknown_and_empty_messages() -> None:
    with pytest.raises(DecodeError, match="unknown pgoutput message type") as info:
        decode_message(b"Z123")
    assert info.value.message_type == "Z"
    with pytest.raises(DecodeError, match="empty message"):
        decode_message(b"")
    with pytest.raises(DecodeError) as unprintable:
        decode_message(b"\x01")
    assert unprintable.value.message_type == "\\x01"


@pytest.mark.parametrize(
    ("message_type", "since"),
    [(t, 2) for t in "SEcA"] + [(t, 3) for t in "bPKrp"],
)
def test_message_types_need_their_protocol_version(message_type: str, since: int) -> None:
    with pytest.raises(DecodeError, match=f"needs proto_version {since}"):
        decode_message(message_type.encode(), proto_version=since - 1)


def test_protocol_version_range() -> None:
    with pytest.raises(ValueError, match="proto_version 5"):
        decode_message(b"E", proto_version=5)
    with pytest.raises(DecodeError, match="stream blocks need proto_version 2"):
        decode_message(b"I" + u32(1) + u32(1) + b"N" + u16(0), in_stream=True)


def test_zero_final_lsn_in_begin() -> None:
    with pytest.raises(DecodeError, match="final LSN is 0/0"):
        decode_message(b"B" + u64(0) + ts(T1) + u32(1))


def test_truncate_count_larger_than_the_message() -> None:
    with pytest.raises(DecodeError, match="1000 relations announced"):
        decode_message(b"T" + u32(1000) + u8(0) + u32(1))


def test_accepts_bytearray_and_memoryview() -> None:
    data = b"S" + u32(800) + u8(1)
    expected = StreamStartMessage(800, True)
    assert decode_message(bytearray(data), proto_version=2) == expected
    assert decode_message(memoryview(data), proto_version=2) == expected


def test_message_type_constants_are_the_protocol_bytes() -> None:
    assert {t.char for t in MessageType} == set("BCORYIUDTMSEcAbPKrp")
    assert ord("I") == MessageType.INSERT
    assert MessageType.STREAM_PREPARE.char == "p"


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

any_u32 = st.integers(0, 2**32 - 1)
any_u8 = st.integers(0, 255)
lsns = st.integers(1, 2**64 - 1).map(LSN)
# whole microseconds in the range PostgreSQL commit times take (and datetime can hold)
timestamps = st.datetimes(min_value=dt.datetime(1990, 1, 1), max_value=dt.datetime(2200, 1, 1)).map(
    lambda d: d.replace(tzinfo=dt.UTC)
)
names = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=20
)
gids = names.filter(bool)
column_values = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.binary(max_size=40),
    st.binary(max_size=12).map(Binary),
)
tuples = st.lists(column_values, max_size=8).map(tuple)
xids = st.one_of(st.none(), any_u32)  # None: outside a stream, no xid prefix


def _data(draw: st.DrawFn, kind: str, xid: int | None) -> PgOutputMessage:
    rel = draw(any_u32)
    if kind == "R":
        typmods = st.integers(-1, 2**31 - 1)
        column = st.builds(RelationColumn, st.sampled_from([0, 1]), names, any_u32, typmods)
        columns = draw(st.lists(column, max_size=6))
        namespace = draw(names.filter(lambda n: n != "") | st.just("pg_catalog"))
        return RelationMessage(
            xid, rel, namespace, draw(names), draw(st.sampled_from("dnfi")), tuple(columns)
        )
    if kind == "Y":
        return TypeMessage(xid, rel, draw(names.filter(bool) | st.just("pg_catalog")), draw(names))
    if kind == "I":
        return InsertMessage(xid, rel, draw(tuples))
    if kind == "U":
        old_kind = draw(st.sampled_from([None, "K", "O"]))
        old = None if old_kind is None else draw(tuples)
        return UpdateMessage(xid, rel, old_kind, old, draw(tuples))  # type: ignore[arg-type]
    if kind == "D":
        return DeleteMessage(xid, rel, draw(st.sampled_from(["K", "O"])), draw(tuples))
    if kind == "T":
        return TruncateMessage(
            xid, draw(st.integers(0, 3)), tuple(draw(st.lists(any_u32, max_size=5)))
        )
    return LogicalDecodingMessage(
        xid, draw(st.integers(0, 1)), draw(lsns), draw(names), draw(st.binary(max_size=30))
    )


@st.composite
def messages(draw: st.DrawFn) -> tuple[PgOutputMessage, dict[str, Any]]:
    """A random message and the decode_message options it needs."""
    kind = draw(st.sampled_from("BCORYIUDTMSEcAbPKrp"))
    if kind in "RYIUDTM":
        xid = draw(xids)
        options = {"proto_version": 2 if xid is not None else 1, "in_stream": xid is not None}
        return _data(draw, kind, xid), options
    v2: dict[str, Any] = {"proto_version": 2}
    v3: dict[str, Any] = {"proto_version": 3}
    if kind == "B":
        return BeginMessage(draw(lsns), draw(timestamps), draw(any_u32)), {}
    if kind == "C":
        return CommitMessage(draw(any_u8), draw(lsns), draw(lsns), draw(timestamps)), {}
    if kind == "O":
        return OriginMessage(draw(lsns), draw(names)), {}
    if kind == "S":
        return StreamStartMessage(draw(any_u32), draw(st.booleans())), v2
    if kind == "E":
        return StreamStopMessage(), v2
    if kind == "c":
        return StreamCommitMessage(
            draw(any_u32), draw(any_u8), draw(lsns), draw(lsns), draw(timestamps)
        ), v2
    if kind == "A":
        if draw(st.booleans()):  # protocol 4 with streaming 'parallel'
            abort = StreamAbortMessage(draw(any_u32), draw(any_u32), draw(lsns), draw(timestamps))
            return abort, {"proto_version": 4, "abort_info": True}
        return StreamAbortMessage(draw(any_u32), draw(any_u32)), v2
    if kind == "b":
        fields = (draw(lsns), draw(lsns), draw(timestamps), draw(any_u32), draw(gids))
        return BeginPrepareMessage(*fields), v3
    if kind == "r":
        return RollbackPreparedMessage(
            draw(any_u8), draw(lsns), draw(lsns), draw(timestamps), draw(timestamps), draw(any_u32),
            draw(gids),
        ), v3  # fmt: skip
    cls = {"P": PrepareMessage, "p": StreamPrepareMessage, "K": CommitPreparedMessage}[kind]
    return cls(
        draw(any_u8), draw(lsns), draw(lsns), draw(timestamps), draw(any_u32), draw(gids)
    ), v3


@SETTINGS
@given(messages())
def test_encode_decode_round_trip(case: tuple[PgOutputMessage, dict[str, Any]]) -> None:
    message, options = case
    assert decode_message(encode(message), **options) == message


@SETTINGS
@given(messages(), st.data())
def test_any_truncation_is_a_decode_error(
    case: tuple[PgOutputMessage, dict[str, Any]], data: st.DataObject
) -> None:
    message, options = case
    raw = encode(message)
    cut = data.draw(st.integers(0, len(raw) - 1), label="cut")
    try:
        decode_message(raw[:cut], **options)
    except DecodeError as exc:
        assert exc.message_type in (raw[:1].decode(), "?")
        assert 0 <= exc.offset <= cut
    else:
        raise AssertionError(f"{raw[:cut]!r} (cut at {cut} of {len(raw)}) decoded")


@SETTINGS
@given(messages(), st.data())
def test_corruption_never_escapes_as_another_exception(
    case: tuple[PgOutputMessage, dict[str, Any]], data: st.DataObject
) -> None:
    message, options = case
    raw = bytearray(encode(message))
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        position = data.draw(st.integers(0, len(raw) - 1), label="position")
        raw[position] = data.draw(any_u8, label="byte")
    # DecodeError is the only failure allowed; decoding to another valid record is fine too
    with contextlib.suppress(DecodeError):
        decode_message(bytes(raw), **options)


@SETTINGS
@given(st.binary(max_size=64), st.integers(1, 4), st.booleans())
def test_random_bytes_decode_or_raise_decode_error(
    raw: bytes, version: int, in_stream: bool
) -> None:
    with contextlib.suppress(DecodeError):
        decode_message(raw, proto_version=version, in_stream=in_stream and version >= 2)
