"""Property tests: any message encodes and decodes back to itself; any damage is a DecodeError."""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.decoder import decode_message
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
from tests.support.pgoutput_encoder import encode

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u32 = st.integers(0, 2**32 - 1)
u8 = st.integers(0, 255)
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
xids = st.one_of(st.none(), u32)  # None: outside a stream, no xid prefix


def _data(draw: st.DrawFn, kind: str, xid: int | None) -> PgOutputMessage:
    rel = draw(u32)
    if kind == "R":
        typmods = st.integers(-1, 2**31 - 1)
        column = st.builds(RelationColumn, st.sampled_from([0, 1]), names, u32, typmods)
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
        return TruncateMessage(xid, draw(st.integers(0, 3)), tuple(draw(st.lists(u32, max_size=5))))
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
        return BeginMessage(draw(lsns), draw(timestamps), draw(u32)), {}
    if kind == "C":
        return CommitMessage(draw(u8), draw(lsns), draw(lsns), draw(timestamps)), {}
    if kind == "O":
        return OriginMessage(draw(lsns), draw(names)), {}
    if kind == "S":
        return StreamStartMessage(draw(u32), draw(st.booleans())), v2
    if kind == "E":
        return StreamStopMessage(), v2
    if kind == "c":
        return StreamCommitMessage(
            draw(u32), draw(u8), draw(lsns), draw(lsns), draw(timestamps)
        ), v2
    if kind == "A":
        if draw(st.booleans()):  # protocol 4 with streaming 'parallel'
            abort = StreamAbortMessage(draw(u32), draw(u32), draw(lsns), draw(timestamps))
            return abort, {"proto_version": 4, "abort_info": True}
        return StreamAbortMessage(draw(u32), draw(u32)), v2
    if kind == "b":
        fields = (draw(lsns), draw(lsns), draw(timestamps), draw(u32), draw(gids))
        return BeginPrepareMessage(*fields), v3
    if kind == "r":
        return RollbackPreparedMessage(
            draw(u8), draw(lsns), draw(lsns), draw(timestamps), draw(timestamps), draw(u32),
            draw(gids),
        ), v3  # fmt: skip
    cls = {"P": PrepareMessage, "p": StreamPrepareMessage, "K": CommitPreparedMessage}[kind]
    return cls(draw(u8), draw(lsns), draw(lsns), draw(timestamps), draw(u32), draw(gids)), v3


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
        raw[position] = data.draw(u8, label="byte")
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
