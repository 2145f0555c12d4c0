"""The replication protocol's frames, byte for byte: what a walsender sends, what we answer."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from airflow_pglogrepl.changelog.columnar import ColumnarDecoder
from airflow_pglogrepl.exceptions import StreamProtocolError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import Change, PgOutputStream
from airflow_pglogrepl.postgres.stream_frames import (
    XLOG_HEADER,
    frames,
    keepalive,
    pg_now_us,
    replication_literal,
    start_replication,
    status_update,
    xlog_data,
)
from tests.support.recorded_frames import load

pytestmark = pytest.mark.unit


def _keepalive(wal_end: int, *, reply: bool = False, now_us: int = 7) -> bytes:
    return struct.pack("!cQqB", b"k", wal_end, now_us, int(reply))


def test_a_status_update_is_34_bytes_with_flush_and_apply_at_the_lakes_position() -> None:
    frame = status_update(received=0x16B374D848, flushed=0x15FFFFFF00, now_us=123, reply=True)
    assert len(frame) == 34
    kind, written, flushed, applied, clock, reply = struct.unpack("!cQQQqB", frame)
    assert (kind, written, flushed, applied, clock, reply) == (
        b"r", 0x16B374D848, 0x15FFFFFF00, 0x15FFFFFF00, 123, 1)  # fmt: skip


def test_a_status_update_never_confirms_past_what_was_received() -> None:
    with pytest.raises(ValueError, match="past received"):
        status_update(received=10, flushed=11)


def test_the_clock_counts_from_2000() -> None:
    assert pg_now_us(946_684_800.0) == 0
    assert pg_now_us(946_684_801.5) == 1_500_000


def test_a_keepalive_is_parsed_and_a_wrong_one_refused() -> None:
    parsed = keepalive(_keepalive(0x1_0000_0001, reply=True, now_us=-5))
    assert parsed.wal_end == LSN("1/1") and parsed.server_time_us == -5
    assert parsed.reply_requested
    with pytest.raises(StreamProtocolError, match="18 bytes"):
        keepalive(_keepalive(1)[:-1])
    with pytest.raises(StreamProtocolError, match="starting with 'k'"):
        keepalive(b"w" + _keepalive(1)[1:])


def test_frames_split_messages_from_headers_and_keepalives() -> None:
    chunks = [
        _keepalive(50),
        xlog_data(100, 200, b"B" + b"\x01" * 20),
        xlog_data(110, 210, b"I"),
        _keepalive(300, reply=True),
        xlog_data(120, 220, b"C" + bytes(range(25))),
    ]
    batch = frames(chunks)
    assert batch.messages.to_pylist() == [b"B" + b"\x01" * 20, b"I", b"C" + bytes(range(25))]
    assert str(batch.messages.type) == "large_binary"
    assert batch.starts.tolist() == [100, 110, 120]
    assert [int(k.wal_end) for k in batch.keepalives] == [50, 300]
    assert batch.reply_requested
    assert int(batch.wal_end) == 300


def test_frames_take_memoryviews_and_an_empty_batch() -> None:
    batch = frames([memoryview(xlog_data(1, 2, b"R" * 3))])
    assert batch.messages.to_pylist() == [b"RRR"] and int(batch.wal_end) == 2
    empty = frames([])
    assert len(empty.messages) == 0 and int(empty.wal_end) == 0
    assert not empty.reply_requested


def test_a_message_may_be_empty_but_no_frame_may_be_shorter_than_its_header() -> None:
    assert frames([xlog_data(1, 1, b"")]).messages.to_pylist() == [b""]
    with pytest.raises(StreamProtocolError, match="shorter than its 25-byte header"):
        frames([xlog_data(1, 1, b"")[: XLOG_HEADER - 1]])


@pytest.mark.parametrize("frame", [b"", b"x123", b"r" + bytes(33)])
def test_a_frame_of_another_kind_stops_the_stream(frame: bytes) -> None:
    with pytest.raises(StreamProtocolError):
        frames([xlog_data(1, 1, b"B"), frame])


def test_the_start_command_quotes_the_slot_and_binds_option_values() -> None:
    command = start_replication(
        "slot_1", LSN("16/B374D848"),
        {"proto_version": "2", "publication_names": "\"a'b\",c"}, None,
    )  # fmt: skip
    assert command == (
        b'START_REPLICATION SLOT "slot_1" LOGICAL 16/B374D848 '
        b"(\"proto_version\" '2', \"publication_names\" '\"a''b\",c')"
    )


def test_a_slot_name_the_server_would_refuse_is_refused_here() -> None:
    with pytest.raises(ValueError):
        start_replication('x" LOGICAL 0/0; DROP', 0, {}, None)


# -- frames a walsender sent (tests/support/recorded_frames.py; PostgreSQL 15) ----------------

RECORDED = Path(__file__).parent / "recorded" / "pgoutput_v1.frames"


def test_recorded_frames_give_the_messages_and_pings_the_server_sent() -> None:
    chunks = load(RECORDED)
    batch = frames(chunks)
    assert len(batch.messages) + len(batch.keepalives) == len(chunks) == 21
    assert [m[:1] for m in batch.messages.to_pylist()] == [m.encode() for m in "BRIIRIICBUUDCBRTC"]
    assert len(batch.keepalives) == 4
    # a message's position: its change's WAL record (none for a Relation), a Commit's end
    assert batch.starts.tolist()[:3] == [0x19293A0, 0, 0x19293A0]
    assert batch.wal_end == max(k.wal_end for k in batch.keepalives)
    # split anywhere, the batches give the same messages in order
    halves = [frames(chunks[:9]), frames(chunks[9:])]
    assert [m for b in halves for m in b.messages.to_pylist()] == batch.messages.to_pylist()


def test_recorded_frames_decode_to_the_changes_that_were_made() -> None:
    messages = frames(load(RECORDED)).messages.to_pylist()
    events = PgOutputStream.from_options({"proto_version": "1"}).decode(
        (LSN(0), None, m) for m in messages
    )
    changes = [(str(c.table.table), c.op, c.new) for c in events if isinstance(c, Change)]
    assert [(table, op) for table, op, _ in changes] == [
        ('Odd "T"', "I"), ('Odd "T"', "I"), ("plain", "I"), ("plain", "I"),
        ('Odd "T"', "U"), ("plain", "U"), ('Odd "T"', "D"), ("plain", "T"),
    ]  # fmt: skip
    first = changes[0][2]
    assert first["note"] == "zürich" and first["tags"] == ["a", "b c"]
    assert str(first["amount"]) == "12.50"
    assert changes[4][2]["note"] == "n'2"


def test_the_columnar_decoder_reads_recorded_frames_as_one_column() -> None:
    pieces = ColumnarDecoder({"proto_version": "1"}).feed(frames(load(RECORDED)).messages)
    rows: dict[str, int] = {}
    for piece in pieces:  # a piece per table description (a Relation message each)
        rows[piece.table.table] = rows.get(piece.table.table, 0) + piece.rows.num_rows
    assert rows == {'Odd "T"': 4, "plain": 4}


def test_values_are_the_replication_grammars_strings_even_with_backslashes() -> None:
    """The replication scanner knows no E'' strings: psycopg's Literal of a backslash is one."""
    assert replication_literal("a\\b'c") == "'a\\b''c'"
    with pytest.raises(ValueError, match="NUL"):
        replication_literal("a\x00b")
