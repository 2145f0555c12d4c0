"""Streamed transactions cut out of a batch (protocol 2): whole transactions pass as they are,
a block's messages lose their xids (kept beside them), a block may span batches, and Stream
Commit and Stream Abort are read field by field; what cannot be a stream is declined."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.columnar import ColumnarUnsupportedError
from airflow_pglogrepl.pgoutput.messages import (
    BeginMessage,
    CommitMessage,
    InsertMessage,
    StreamAbortMessage,
    StreamCommitMessage,
    StreamStartMessage,
    StreamStopMessage,
)
from airflow_pglogrepl.pgoutput.transaction_blocks import (
    Block,
    BlockSplitter,
    Plain,
    StreamAbort,
    StreamCommit,
)
from airflow_pglogrepl.pgoutput.values import OID
from tests.support.pgoutput_encoder import encode, relation

pytestmark = pytest.mark.unit

T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
T0_US = int(T0.timestamp() * 1_000_000)


def batch(*messages: object) -> pa.Array:
    return pa.array([encode(m) for m in messages], pa.large_binary())  # type: ignore[arg-type]


def insert(xid: int | None, value: bytes) -> InsertMessage:
    return InsertMessage(xid, 16384, (value,))  # type: ignore[arg-type]


def test_a_batch_without_a_stream_passes_whole() -> None:
    data = batch(BeginMessage(LSN(0x100), T0, 7), insert(None, b"1"),
                 CommitMessage(0, LSN(0x100), LSN(0x108), T0))  # fmt: skip
    (part,) = BlockSplitter().split(data)
    assert isinstance(part, Plain) and part.messages is data


def test_blocks_lose_their_xids_and_keep_them_beside_interleaved_with_whole_transactions() -> None:
    splitter = BlockSplitter()
    rel = relation(16384, "t", [("id", OID.INT4, True)], xid=900)
    first = batch(
        StreamStartMessage(900, True), rel, insert(900, b"1"), insert(901, b"2"),
        StreamStopMessage(),
        BeginMessage(LSN(0x100), T0, 7), insert(None, b"3"),
        CommitMessage(0, LSN(0x100), LSN(0x108), T0),
        StreamStartMessage(900, False), insert(901, b"4"),
    )  # fmt: skip
    parts = splitter.split(first)
    assert [type(p) for p in parts] == [Block, Plain, Block]
    block, plain, rest = parts
    assert isinstance(block, Block) and isinstance(rest, Block) and isinstance(plain, Plain)
    assert (block.xid, block.first, block.subxids.tolist()) == (900, True, [900, 900, 901])
    assert block.messages.to_pylist() == [
        encode(relation(16384, "t", [("id", OID.INT4, True)])),
        encode(insert(None, b"1")), encode(insert(None, b"2")),
    ]  # fmt: skip
    assert len(plain.messages) == 3
    assert (rest.xid, rest.first, rest.messages.to_pylist()) == (
        900,
        False,
        [encode(insert(None, b"4"))],
    )
    # the block goes on in the next batch, then the transaction's commit and another's abort
    second = batch(insert(900, b"5"), StreamStopMessage(),
                   StreamCommitMessage(900, 0, LSN(0x200), LSN(0x208), T0),
                   StreamAbortMessage(950, 951))  # fmt: skip
    more, commit, abort = splitter.split(second)
    assert isinstance(more, Block) and (more.xid, more.first) == (900, False)
    assert more.messages.to_pylist() == [encode(insert(None, b"5"))]
    assert commit == StreamCommit(900, 0x200, 0x208, T0_US)
    assert abort == StreamAbort(950, 951)


def test_a_sliced_batch_and_a_message_after_a_gap_are_cut_right() -> None:
    data = batch(insert(None, b"0"), StreamStartMessage(5, True), insert(5, b"a"),
                 insert(6, b"bb"), StreamStopMessage())  # fmt: skip
    (block,) = [p for p in BlockSplitter().split(data.slice(1)) if isinstance(p, Block)]
    assert block.messages.to_pylist() == [encode(insert(None, b"a")), encode(insert(None, b"bb"))]
    assert block.subxids.tolist() == [5, 6]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ((StreamStartMessage(1, True), StreamStartMessage(2, True)), "inside a block"),
        ((StreamStopMessage(),), "outside a block"),
        (
            (StreamStartMessage(1, True), StreamCommitMessage(1, 0, LSN(1), LSN(2), T0)),
            "inside a block",
        ),
    ],
)
def test_what_cannot_be_a_stream_is_declined(messages: tuple[object, ...], error: str) -> None:
    with pytest.raises(ColumnarUnsupportedError, match=error):
        BlockSplitter().split(batch(*messages))


def test_a_first_block_whose_stream_start_ends_a_batch_is_still_first() -> None:
    splitter = BlockSplitter()
    assert splitter.split(batch(insert(None, b"0"), StreamStartMessage(5, True)))[1:] == []
    (block,) = splitter.split(batch(insert(5, b"a"), StreamStopMessage()))
    assert isinstance(block, Block) and (block.xid, block.first) == (5, True)
    splitter.split(batch(StreamStartMessage(5, False)))
    (later,) = splitter.split(batch(insert(5, b"b")))
    assert isinstance(later, Block) and not later.first
