"""Overlapping a window's three stages: fetch, decode, write.

On the columnar path a window's stages are each mostly C (ADBC reading the socket and parsing
COPY, numpy and pyarrow decoding, pyarrow's Parquet writer), and each releases the GIL for most
of its time. Run one after the other, the client's share of a window is their sum; run side by
side, it is about the longest of them. So the fetch runs ahead in a thread of its own
(``prefetched``) and the writes run behind in another (``Behind``), each at most a couple of
batches away from the decoder: memory stays bounded.

Order and failure are kept: batches arrive in order, writes run one at a time in the order
they were submitted, and an exception in either thread is raised in the caller's, as itself,
at its next call. Nothing is committed until every write has finished (``Behind.finish``).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["Behind", "prefetched"]

T = TypeVar("T")
_END = object()
_JOIN_S = 5.0


def prefetched(items: Iterator[T], *, depth: int = 2) -> Generator[T, None, None]:
    """``items``, produced by a thread of their own up to ``depth`` ahead of the consumer.

    The producer runs the whole iterator, so a resource it opens (a connection) is used and
    closed in that one thread. If the consumer stops early, the producer stops at its next
    item and closes the iterator; the consumer waits a few seconds for that, not longer.
    """
    slots: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    break
            else:
                put((_END, None))
        except BaseException as exc:  # handed to the consumer, raised there as itself
            put((_END, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="pglogrepl-fetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        # The producer stops at its next item; one blocked waiting for the server's first
        # rows (a failure or signal before any arrived) is left to finish on its own: a daemon.
        thread.join(timeout=_JOIN_S)


class Behind:
    """Calls run one at a time, in order, in a thread of their own, at most ``depth`` behind.

    ``submit`` waits while ``depth`` calls are outstanding, and raises the exception of any
    call that failed; ``finish`` waits for all of them. After a failure nothing more runs.
    """

    def __init__(self, *, depth: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pglogrepl-write")
        self._outstanding: deque[Future[Any]] = deque()
        self._depth = depth
        self._failed = threading.Event()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        while self._outstanding and (
            len(self._outstanding) >= self._depth or self._outstanding[0].done()
        ):
            self._outstanding.popleft().result()
        self._outstanding.append(self._pool.submit(self._run, call, args))

    def _run(self, call: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._failed.is_set():
            return None  # an earlier call failed: its error is what the caller gets
        try:
            return call(*args)
        except BaseException:
            self._failed.set()
            raise

    def finish(self) -> None:
        """Wait for every call; raise the first failure."""
        try:
            while self._outstanding:
                self._outstanding.popleft().result()
        finally:
            self.close()

    def close(self) -> None:
        """Let outstanding calls end (a failure path: their results are not wanted)."""
        for future in self._outstanding:
            future.cancel()
        self._pool.shutdown(wait=True)
        self._outstanding.clear()
