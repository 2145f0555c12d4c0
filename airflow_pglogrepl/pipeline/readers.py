"""The two ways a drain reads its slot, behind one face: batches of pgoutput messages in slot
order, and where a committed window's end goes.

A peek (``pg_logical_slot_peek_binary_changes``) is read one span at a time, up to a fixed end,
and a window's end is made the slot's by advancing it. A stream (``START_REPLICATION``) decodes
each WAL record once and sends each transaction as its commit is decoded; a window's end is
confirmed to its walsender. The columnar windows (``windows``) take either the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from airflow_pglogrepl.identifiers import publication_names_option
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.overlap import prefetched

if TYPE_CHECKING:
    from airflow_pglogrepl.pipeline.follow import Follow
    from airflow_pglogrepl.pipeline.source import DrainSource
    from airflow_pglogrepl.postgres.slot_stream import SlotStream

__all__ = [
    "PeekReader",
    "SlotReader",
    "StreamReader",
    "peek_options",
    "published_before",
    "stream_options",
]


class SlotReader(Protocol):
    """A slot's messages for the columnar windows, and the confirm of what they committed.

    ``exact_end``: a span's last window ends at the span's end exactly, rows past it left to
    the next run (a stream sends on past any end); ``follow``: a following run's clock ticks
    come through ``batches`` as ``(None, None)``; ``options``: pgoutput's, as the reader asked.
    """

    options: Mapping[str, str]
    exact_end: bool
    follow: Follow | None

    def batches(self, start: LSN, end: LSN) -> Iterator[tuple[Any, LSN | None]]:
        """Batches of messages from ``start``, each with the WAL position before which every
        transaction has been sent (None: a peek's, which says nothing until its end)."""
        ...

    def confirm(self, end: LSN) -> object:
        """The lake holds every transaction that commits before ``end``: the slot may move."""
        ...


class PeekReader:
    """The slot read by peeks, a span at a time; the fetch runs ahead in a thread of its own
    (``overlap.prefetched``)."""

    exact_end = False
    follow: Follow | None = None

    def __init__(self, source: DrainSource, slot: str, options: Mapping[str, str]) -> None:
        self.source = source
        self.slot = slot
        self.options = options

    def batches(self, start: LSN, end: LSN) -> Iterator[tuple[Any, LSN | None]]:
        del start  # a peek always reads from the slot's position
        fetched = prefetched(self.source.peek_arrow(self.slot, upto_lsn=end, options=self.options))
        return _PeekBatches(fetched)

    def confirm(self, end: LSN) -> object:
        return self.source.advance_slot(self.slot, end)


class StreamReader:
    """The slot read through one replication stream (``postgres.slot_stream``), from the run's
    start: up to a span's end, or, following, until the run is told to stop."""

    exact_end = True

    def __init__(self, stream: SlotStream, follow: Follow | None) -> None:
        self.stream = stream
        self.follow = follow
        self.options: Mapping[str, str] = stream.options

    def batches(self, start: LSN, end: LSN) -> Iterator[tuple[Any, LSN | None]]:
        del start  # the stream began at the run's start
        if self.follow is not None:
            return _ticking(self.stream, self.follow)
        return _until(self.stream, end)

    def confirm(self, end: LSN) -> object:
        self.stream.confirm(end)  # the slot's flushed position, sent at once
        return None


def peek_options(publications: Sequence[str]) -> dict[str, str]:
    """pgoutput's options for a drain of ``publications``: protocol 1, no logical messages (the
    stream asks for more: ``stream_options``)."""
    return {
        "proto_version": "1",
        "publication_names": publication_names_option(publications),
        "messages": "false",
    }


def published_before(source: DrainSource, slot: str, options: Mapping[str, str],
                     end: LSN) -> bool:  # fmt: skip
    """Whether ``slot`` holds a published change before ``end``: a peek for one change (pgoutput
    sends nothing for a transaction without one). The slot does not move."""
    rows = source.peek_changes(slot, upto_lsn=end, options=options, upto_nchanges=1)
    try:
        return next(iter(rows), None) is not None
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()


def stream_options(options: Mapping[str, str]) -> dict[str, str]:
    """pgoutput's options for the stream: protocol 2 with ``streaming 'on'``, so a transaction
    bigger than the server's ``logical_decoding_work_mem`` is sent while it runs (and waits in
    the lake, ``lake.in_progress``) instead of in the server's spill files until its commit.
    ``SlotStream`` takes protocol 1 back on a server older than 14."""
    return {**options, "proto_version": "2", "streaming": "on"}


class _PeekBatches(Iterator[tuple[Any, LSN | None]]):
    """A peek's Arrow batches as ``(batch, None)``, closed as the fetch is (which ends its
    thread, started or not)."""

    def __init__(self, fetched: Any) -> None:
        self._fetched = fetched
        self._batches = iter(fetched)

    def __next__(self) -> tuple[Any, LSN | None]:
        return next(self._batches), None

    def close(self) -> None:
        self._fetched.close()


def _ticking(stream: SlotStream, follow: Follow) -> Iterator[tuple[Any, LSN | None]]:
    """The stream's messages a batch at a time, each with its WAL end (as ``_until``), and
    ``(None, None)`` whenever nothing came for ``follow.tick_s``: a following run's clock."""
    for batch in stream.batches_or_idle(follow.tick_s()):
        yield (None, None) if batch is None else (batch.messages, batch.wal_end)


def _until(stream: SlotStream, end: LSN) -> Iterator[tuple[Any, LSN | None]]:
    """The stream's messages a batch at a time, each with the WAL position before which every
    transaction has been sent, until that reaches ``end`` (transactions are sent in commit
    order, each as its commit is decoded)."""
    for batch in stream.batches():
        yield batch.messages, batch.wal_end
        if batch.wal_end >= end:
            return
