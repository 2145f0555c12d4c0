"""The layouts the positional readers rely on, checked against the test encoder (which spells
every message out field by field, independently of the decoders)."""

from __future__ import annotations

import datetime as dt
import struct

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import layouts as lay
from airflow_pglogrepl.pgoutput.messages import (
    UNCHANGED_TOAST,
    BeginMessage,
    Binary,
    ColumnKind,
    CommitMessage,
    DeleteMessage,
    InsertMessage,
    LogicalDecodingMessage,
    MessageType,
    PgOutputMessage,
    StreamCommitMessage,
    TruncateMessage,
    TypeMessage,
    UpdateMessage,
)
from tests.support.pgoutput_encoder import T0, encode, relation


@pytest.mark.parametrize("name", [t.name for t in MessageType])
def test_message_types_are_the_protocol_bytes_as_plain_ints(name: str) -> None:
    value = getattr(lay, name)
    assert value == MessageType[name]
    assert type(value) is int  # numpy and the hot loops get an int, not an IntEnum member


def test_the_messages_with_an_xid_in_a_block_are_the_data_messages() -> None:
    """Inside a stream block these carry their (sub-)transaction's xid after the type byte:
    Relation, Type, Insert, Update, Delete, Truncate and a logical Message, nothing else."""
    xid = 0x0A0B0C0D
    data = [
        relation(7, "t", [("id", 23, True)], xid=xid),
        TypeMessage(xid, 16400, "public", "mood"),
        InsertMessage(xid, 7, (b"1",)),
        UpdateMessage(xid, 7, None, None, (b"1",)),
        DeleteMessage(xid, 7, "K", (b"1",)),
        TruncateMessage(xid, 0, (7,)),
        LogicalDecodingMessage(xid, 1, LSN(0x10), "p", b"x"),
    ]
    assert tuple(encode(m)[0] for m in data) == lay.WITH_XID_IN_BLOCK
    assert all(encode(m)[1:5] == xid.to_bytes(4, "big") for m in data)


def test_a_stream_commit_is_its_fixed_size() -> None:
    data = encode(StreamCommitMessage(77, 0, LSN(0x100), LSN(0x180), T0))
    assert data[0] == lay.STREAM_COMMIT and len(data) == lay.STREAM_COMMIT_SIZE


def test_column_kinds_are_one_definition() -> None:
    assert (ColumnKind.NULL, ColumnKind.UNCHANGED_TOAST, ColumnKind.TEXT, ColumnKind.BINARY) == (
        lay.KIND_NULL,
        lay.KIND_TOAST,
        lay.KIND_TEXT,
        lay.KIND_BINARY,
    )
    data = encode(InsertMessage(None, 7, (None, UNCHANGED_TOAST, b"x", Binary(b"y"))))
    tuple_data = data[lay.ROW_TUPLE + 2 :]
    assert [tuple_data[0], tuple_data[1], tuple_data[2], tuple_data[8]] == [
        lay.KIND_NULL,
        lay.KIND_TOAST,
        lay.KIND_TEXT,
        lay.KIND_BINARY,
    ]


def test_begin_and_commit_fields_sit_at_their_offsets() -> None:
    begin = encode(BeginMessage(LSN(0x1234_5678_9ABC), T0, 4242))
    assert len(begin) == lay.BEGIN_SIZE
    assert begin[0] == lay.BEGIN
    assert struct.unpack_from("!Q", begin, lay.BEGIN_LSN)[0] == 0x1234_5678_9ABC
    (micros,) = struct.unpack_from("!q", begin, lay.BEGIN_TS)
    assert (
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros + lay.PG_EPOCH_US)
        == T0
    )
    assert struct.unpack_from("!I", begin, lay.BEGIN_XID)[0] == 4242
    commit = encode(CommitMessage(0, LSN(0xABCDEF), LSN(0xABCE00), T0))
    assert len(commit) == lay.COMMIT_SIZE
    assert commit[0] == lay.COMMIT
    assert struct.unpack_from("!Q", commit, lay.COMMIT_LSN)[0] == 0xABCDEF


@pytest.mark.parametrize(
    ("message", "marker"),
    [
        (InsertMessage(None, 16385, (b"1",)), lay.NEW_TUPLE),
        (UpdateMessage(None, 16385, None, None, (b"1",)), lay.NEW_TUPLE),
        (UpdateMessage(None, 16385, "K", (b"1",), (b"2",)), lay.OLD_KEY),
        (UpdateMessage(None, 16385, "O", (b"1",), (b"2",)), lay.OLD_ROW),
        (DeleteMessage(None, 16385, "K", (b"1",)), lay.OLD_KEY),
        (DeleteMessage(None, 16385, "O", (b"1",)), lay.OLD_ROW),
    ],
)
def test_a_row_message_names_its_relation_then_its_first_tuple(
    message: PgOutputMessage, marker: int
) -> None:
    data = encode(message)
    assert struct.unpack_from("!I", data, lay.ROW_RELID)[0] == 16385
    assert data[lay.ROW_MARKER] == marker
    assert struct.unpack_from("!H", data, lay.ROW_TUPLE)[0] == 1  # the tuple's column count


def test_the_markers_and_kinds_differ_from_each_other() -> None:
    markers = {lay.NEW_TUPLE, lay.OLD_KEY, lay.OLD_ROW}
    kinds = {lay.KIND_NULL, lay.KIND_TOAST, lay.KIND_TEXT, lay.KIND_BINARY}
    assert len(markers) == 3 and len(kinds) == 4 and not markers & kinds


def test_the_epoch_is_2000_01_01() -> None:
    epoch = dt.datetime(2000, 1, 1, tzinfo=dt.UTC) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    assert epoch // dt.timedelta(microseconds=1) == lay.PG_EPOCH_US
    assert encode(TruncateMessage(None, 0, (1,)))[0] == lay.TRUNCATE
