"""The hand-over between a stream's reader and its consumer: batches pending behind a full
queue in order, keepalive-only batches in a row kept as one, the reader held back only once a
batch's bytes are pending, and the end handed over after every batch."""

from __future__ import annotations

import queue
import struct

import numpy as np
import pyarrow as pa
import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.frame_queue import FrameQueue
from airflow_pglogrepl.postgres.stream_frames import FrameBatch, frames

pytestmark = pytest.mark.unit


def data(end: int, size: int = 100) -> FrameBatch:
    return FrameBatch(pa.array([b"x" * size], pa.large_binary()), np.array([end], np.uint64),
                      (), LSN(end))  # fmt: skip


def ping(end: int) -> FrameBatch:
    return frames([struct.pack("!cQqB", b"k", end, 0, 1)])


class FullError(Exception):
    """What the test's ``waiting`` raises: the reader would have waited for room."""


def fill(frames_queue: FrameQueue, count: int) -> None:
    for end in range(1, count + 1):
        assert frames_queue.offer(data(end)) is False


def drain(frames_queue: FrameQueue) -> list[int]:
    ends = []
    while True:
        try:
            item = frames_queue.get(0)
        except queue.Empty:
            return ends
        assert isinstance(item, FrameBatch)
        ends.append(int(item.wal_end))


def waits() -> None:
    raise FullError


def test_pings_behind_a_full_queue_never_hold_the_reader_and_are_kept_as_one() -> None:
    """Before: every keepalive took a place; with the queue full the reader waited, and read
    nothing more (a server shutting down was never heard asking)."""
    frames_queue = FrameQueue(2, ahead_bytes=1000, waiting=waits, wait_s=0)
    fill(frames_queue, 2)
    for end in (3, 4, 5):
        assert frames_queue.offer(ping(end)) is False
    assert frames_queue.pending
    assert drain(frames_queue) == [1, 2]
    frames_queue.pass_pending()
    assert drain(frames_queue) == [5] and not frames_queue.pending


def test_changes_behind_a_full_queue_wait_in_order_until_a_batch_of_bytes_is_pending() -> None:
    frames_queue = FrameQueue(2, ahead_bytes=250, waiting=waits, wait_s=0)
    fill(frames_queue, 2)
    assert frames_queue.offer(data(3)) is False
    assert frames_queue.offer(ping(4)) is False
    assert frames_queue.offer(data(5)) is False  # 200 bytes pending
    with pytest.raises(FullError):  # 300: the reader waits for room now
        frames_queue.offer(data(6))
    assert drain(frames_queue) == [1, 2]
    frames_queue.pass_pending()
    assert drain(frames_queue) == [3, 4]
    frames_queue.pass_pending()
    assert drain(frames_queue) == [5, 6]


def test_the_end_comes_after_every_pending_batch_or_not_once_the_consumer_closed() -> None:
    frames_queue = FrameQueue(1, ahead_bytes=1000, waiting=waits, wait_s=0)
    fill(frames_queue, 1)
    frames_queue.offer(ping(2))
    closed = [False]

    def consumer_closes() -> bool:  # the consumer takes one batch, then closes the stream
        if frames_queue.pending and not closed[0]:
            drain(frames_queue)
            return False
        closed[0] = True
        return True

    frames_queue.end(None, stopped=consumer_closes)
    assert closed[0]
    assert drain(frames_queue) == [2]  # the ping got in; the end was given up

    frames_queue.end(ValueError("x"), stopped=lambda: False)
    assert isinstance(frames_queue.get(0), ValueError)
