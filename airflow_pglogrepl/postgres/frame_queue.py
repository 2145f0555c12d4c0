"""The hand-over between a stream's reader thread and its consumer: a bounded queue of frame
batches, and up to one batch's bytes more read ahead behind it while the consumer is busy.

The reader must go on reading while the consumer is busy (a long commit) for one reason above
all: a server shutting down (``pg_ctl stop -m fast``) waits for its walsenders, and a walsender
at shutdown waits until its client has confirmed everything it sent, or has gone. It asks
after every reply, and only a reader that reads sees it ask (``SlotStream._check_stopping``).
A reader that stopped at a full queue saw nothing, answered on time all the same, and kept the
server's shutdown waiting for the consumer's commit. So the batches that find the queue full
wait in order behind it, and the reader stops reading only once they hold ``ahead_bytes`` of
messages: a walsender that has sent everything is heard however long the consumer takes.
Keepalive-only batches in a row are one (the consumer reads nothing from them but
``wal_end``), so pings never fill anything.
"""

from __future__ import annotations

import collections
import queue
from collections.abc import Callable

from airflow_pglogrepl.postgres.stream_frames import FrameBatch

__all__ = ["FrameQueue", "Item"]

Item = FrameBatch | BaseException | None  # a batch, the stream's error, or its end (None)


class FrameQueue:
    """At most ``size`` items for the consumer, and batches pending behind them in order.

    ``waiting`` is called while the reader waits for room, about every ``wait_s`` seconds: it
    keeps the walsender answered, and raises to stop the wait (the consumer closed the stream).
    """

    def __init__(
        self, size: int, *, ahead_bytes: int, waiting: Callable[[], object], wait_s: float
    ) -> None:
        self._queue: queue.Queue[Item] = queue.Queue(size)
        self._pending: collections.deque[FrameBatch] = collections.deque()
        self._pending_bytes = 0
        self.ahead_bytes = ahead_bytes
        self._waiting = waiting
        self.wait_s = wait_s

    @property
    def pending(self) -> bool:
        """Batches wait for room (the consumer should wake the reader as it takes one)."""
        return bool(self._pending)

    def offer(self, batch: FrameBatch) -> bool:
        """Hand ``batch`` over or keep it pending; whether the reader had to wait for room
        (it heard nothing meanwhile): only once the pending batches hold ``ahead_bytes``."""
        last = self._pending[-1] if self._pending else None
        if last is not None and len(batch.messages) == 0 and len(last.messages) == 0:
            if batch.wal_end >= last.wal_end:
                self._pending[-1] = batch
        else:
            self._pending.append(batch)
            self._pending_bytes += batch.messages.nbytes
        self.pass_pending()
        waited = False
        while self._pending and self._pending_bytes >= self.ahead_bytes:
            waited = True
            self._put_first(lambda: False)
        return waited

    def pass_pending(self) -> None:
        """The pending batches handed over as far as there is room now."""
        while self._pending:
            try:
                self._queue.put_nowait(self._pending[0])
            except queue.Full:
                return
            self._pending_bytes -= self._pending.popleft().messages.nbytes

    def end(self, item: BaseException | None, *, stopped: Callable[[], bool]) -> None:
        """Hand over the stream's error or its end (None) after every batch before it, never in
        place of one (a consumer that stops at a position must have had all before it); given
        up once ``stopped`` (the consumer closed the stream)."""
        while self._pending:
            if not self._put_first(stopped):
                return
        while not stopped():
            try:
                self._queue.put(item, timeout=1.0)
                return
            except queue.Full:
                continue

    def get(self, timeout: float | None) -> Item:
        """The next item; ``queue.Empty`` when none came within ``timeout`` seconds."""
        return self._queue.get(timeout=timeout)

    def _put_first(self, stopped: Callable[[], bool]) -> bool:
        """The first pending batch into the queue, waiting for room; False once ``stopped``."""
        while not stopped():
            try:
                self._queue.put(self._pending[0], timeout=self.wait_s)
            except queue.Full:
                self._waiting()
                continue
            self._pending_bytes -= self._pending.popleft().messages.nbytes
            return True
        return False
