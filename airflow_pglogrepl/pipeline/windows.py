"""The columnar path's windows: batches of messages (from a peek or the stream) decoded and cut
into windows at LSN bounds, each written and committed on its own.

A window holds the transactions whose commit record starts before its end. The decoder hands
rows per table for a whole batch, so a window is cut only once every table's rows before its
end are added; its writes run behind in a thread of their own (``overlap.Behind``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columnar import ColumnarDecoder, InProgress, TablePiece
from airflow_pglogrepl.changelog.columns import COMMIT_LSN, COMMIT_TS
from airflow_pglogrepl.lake.in_progress import InProgressTransactions
from airflow_pglogrepl.lake.window import at_or_after
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.stream_blocks import StreamAbort
from airflow_pglogrepl.pipeline.follow import Follow, freshness_of
from airflow_pglogrepl.pipeline.overlap import Behind
from airflow_pglogrepl.pipeline.results import WindowStats, fold_older, log_window
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.pipeline.drain import Drain

__all__ = ["OpenWindow", "columnar_windows", "window_end"]


def window_end(end: LSN | int, commit_lsns: Iterable[int]) -> LSN:
    """Where a window the peek read up to ``end`` ends, given the commit LSNs it holds (where
    their commit records start): at ``end``, or just past a commit that starts at or beyond it.

    The peek stops once a record ends at or past ``end``. When ``end`` lies inside a WAL page's
    header and the record before ends exactly at the page's start, that record ends before
    ``end``, so the record after the header is read too; a commit record there comes back
    although it starts past ``end``. Once the slot is advanced to the window's end the server
    skips the commits that start before it (SnapBuildXactNeedsSkip against
    confirmed_flush_lsn): a window ended at ``end`` would leave that commit to the next window,
    which would decode and store it again.
    """
    last = max(commit_lsns, default=-1)
    return LSN(last + 1) if last >= int(end) else LSN(end)


def columnar_windows(
    drain: Drain,
    start: LSN,
    span_end: LSN,
    done: list[WindowStats],
    fetched: Any,
    *,
    exact_end: bool,
    follow: Follow | None = None,
    options: dict[str, str] | None = None,
) -> None:
    """Cut ``fetched`` (batches of messages, in slot order) into the windows of
    ``[start, span_end)`` for ``drain`` (``Drain._columnar_span`` says how), committing each
    and appending it to ``done``. ``fetched`` is closed on a failure.

    A stream's batches come as ``(messages, wal_end)``: every transaction that commits before
    ``wal_end`` has been sent, so each window that ends at or before it is committed then,
    empty or not. Through unpublished traffic the slot so moves window by window, as with
    peeks, instead of at the run's end only.

    ``follow`` (a following run, ``pipeline.follow``): the stream's items may also be
    ``(None, None)``, a tick of the clock while nothing came. A window holding changes is also
    committed once ``follow.window_s`` has passed since the last commit, and the run ends, its
    last window committed, once ``follow.over``; either cut is at the highest WAL end the
    server has sent, before which every transaction was sent whole.

    ``options``: the stream's, when it asked for ``streaming 'on'``: a transaction sent while
    still in progress waits in the lake (``lake.in_progress``) until its Stream Commit, then
    joins the windows in its commit's place, a file at a time."""
    import numpy as np

    decoder = ColumnarDecoder(options or drain.options)
    floors: dict[int, int] = {}
    last = int(span_end)
    current = OpenWindow(drain, start, min(last, int(start) + drain.max_window_bytes), follow)
    sent = int(start)  # every transaction committing before it has been read (a stream's)
    # Through WAL with no published change (other tables' traffic, a big transaction still in
    # progress) windows are committed empty as the stream's WAL end passes them, each twice
    # the size of the one before: the slot moves on, in a few commits however far it goes.
    empty_bytes = drain.max_window_bytes
    in_progress = None
    if decoder.streams:  # (what an earlier run left there was removed as this one began)
        in_progress = InProgressTransactions(drain.lake)

    def place(batch_pieces: list[TablePiece]) -> None:
        """Add rows to the windows they belong to, committing each window left behind."""
        nonlocal current
        # A batch holds one piece per table, each with its rows of every transaction in
        # the batch: a window is cut only once all pieces' rows before it are added.
        pieces = []
        for piece in batch_pieces:
            rows = piece.rows
            floor = drain._floor(floors, piece.table, start)
            if floor:  # rows the table's state already holds (a re-snapshot after them)
                rows = at_or_after(rows, floor)
            if exact_end and rows.num_rows:  # rows past the span: the next run's
                past = rows.column(COMMIT_LSN).to_numpy()
                rows = rows.slice(0, int(np.searchsorted(past, last)))
            if rows.num_rows:
                pieces.append((piece.table, rows, rows.column(COMMIT_LSN).to_numpy()))
        while pieces:
            first = min(int(lsns[0]) for _, _, lsns in pieces)
            if first >= last:  # a commit the peek read past its end (``window_end``)
                current.boundary = int(window_end(last, [first]))
            elif first >= current.boundary:
                if any(c < current.boundary for c in decoder.commit_lsns):
                    done.append(current.commit(decoder.commit_lsns))
                    current = OpenWindow(drain, LSN(current.boundary), current.boundary,
                                         follow)  # fmt: skip
                while first >= current.boundary:  # never committed empty
                    current.boundary += drain.max_window_bytes
                current.boundary = min(current.boundary, last)
            rest = []
            for table, rows, lsns in pieces:
                split = int(np.searchsorted(lsns, current.boundary))
                current.add(TablePiece(table, rows.slice(0, split)))
                if split < len(lsns):
                    rest.append((table, rows.slice(split), lsns[split:]))
            pieces = rest

    try:
        for item in fetched:
            data, wal_end = item if isinstance(item, tuple) else (item, None)
            if follow is not None and data is not None and follow.over():
                # Stopping with a transaction read in part: read it to its Commit, and no
                # further (the rest is sent again to the next run), then cut past it.
                data, wal_end = through_first_commit(data, wal_end)
            if wal_end is not None:
                sent = max(sent, int(wal_end))
            for part in decoder.parts(data) if data is not None else ():
                if isinstance(part, list):
                    place(part)
                elif isinstance(part, InProgress):
                    assert in_progress is not None
                    in_progress.add(part)
                elif isinstance(part, StreamAbort):
                    assert in_progress is not None
                    in_progress.abort(part.xid, part.subxid)
                else:  # a Stream Commit: its rows, a file at a time, in its commit's place
                    assert in_progress is not None
                    for piece in in_progress.commit(part):
                        place([piece])
            while (
                wal_end is not None
                and current.boundary <= int(wal_end)
                and (current.boundary < last)
            ):
                if not current.stats.changes and not any(
                    c < current.boundary for c in decoder.commit_lsns
                ):  # nothing published: one window up to what was sent, twice the last's size
                    if (
                        int(wal_end) >= last
                        or int(wal_end) - int(current.stats.start) < empty_bytes
                    ):
                        break  # (the window ending at ``last`` is the run's last, below)
                    current.boundary = int(wal_end)
                    empty_bytes *= 2
                else:
                    empty_bytes = drain.max_window_bytes
                done.append(current.commit(decoder.commit_lsns))
                step = min(last, current.boundary + drain.max_window_bytes)
                current = OpenWindow(drain, LSN(current.boundary), step, follow)
            if follow is None:
                continue
            drain.run_end = LSN(max(int(drain.run_end), sent))  # (what "lag left" is from)
            over = follow.over()
            if over or (current.stats.changes and current.age() >= follow.window_s):
                # Cut where every transaction before has been read whole: at the highest WAL
                # end sent, once that is past every row the window holds. A transaction read
                # in part (its rows are placed batch by batch) holds the cut back until its
                # Commit is read, a stop too: its rest is on the way.
                cut = min(current.boundary, sent)
                if cut > int(current.stats.start) and cut > current.top:
                    current.boundary = cut
                    done.append(current.commit(decoder.commit_lsns))
                    fold_older(done)  # a run of days: a bounded record of its windows
                    step = min(last, cut + drain.max_window_bytes)
                    current = OpenWindow(drain, LSN(cut), step, follow)
                if over and not current.stats.changes:
                    current.abandon()  # nothing of it was read
                    return
        if follow is not None:  # the stream ended without an error: only a close does that
            current.abandon()
            return
        # past a commit read past the end even when the table floors left none of its rows
        if exact_end:
            current.boundary = last
        else:
            current.boundary = int(window_end(max(current.boundary, last),
                                              decoder.commit_lsns))  # fmt: skip
        done.append(current.commit(decoder.commit_lsns))
    except BaseException:
        fetched.close()
        current.abandon()
        raise
    finally:
        if in_progress is not None:  # what is still in progress is sent again next time
            in_progress.report()
            in_progress.clear()


class OpenWindow:
    """A columnar window being filled: its queued pieces per table, its writer, its boundary
    (the LSN its transactions' commit records start before). In a following run (``follow``)
    it also keeps its transactions' commit times, for their freshness."""

    def __init__(
        self, drain: Drain, start: LSN, boundary: int, follow: Follow | None = None
    ) -> None:
        self.drain = drain
        self.follow = follow
        self.commits: list[tuple[Any, Any]] = []  # (commit LSNs, commit times), following
        self.began = time.monotonic()
        self.top = -1  # the highest commit LSN of the rows added: the window must end past it
        self.stats = WindowStats(start=start, end=start, decoder="columnar")
        self.window = drain.lake.open_window(start)
        self.boundary = boundary
        self.behind = Behind()
        self.pending: dict[int, list[TablePiece]] = {}  # relation OID -> one description's
        self.queued_rows: dict[int, int] = {}

    def add(self, piece: TablePiece) -> None:
        """Queue rows of the window; a table's queue is written once it holds ``batch_rows``,
        or when the table's description changes (the older rows first)."""
        rows = piece.rows.num_rows
        if not rows:
            return
        if self.follow is not None:
            self.commits.append(_commit_times(piece.rows))
        self.top = max(self.top, int(piece.rows.column(COMMIT_LSN)[-1].as_py()))
        self.stats.changes += rows
        relid = piece.table.relation_id or 0
        queued = self.pending.setdefault(relid, [])
        if queued and queued[0].table is not piece.table:
            self._write(queued)
            self.queued_rows[relid] = 0
        queued.append(piece)
        self.queued_rows[relid] = self.queued_rows.get(relid, 0) + rows
        if self.queued_rows[relid] >= self.drain.batch_rows:
            self._write(queued)
            self.queued_rows[relid] = 0

    def _write(self, pieces: list[TablePiece]) -> None:
        """Hand one table description's queued pieces to the writer (and empty the queue)."""
        import pyarrow as pa

        table = pieces[0].table
        rows = pa.concat_tables([p.rows for p in pieces]) if len(pieces) > 1 else pieces[0].rows
        pieces.clear()
        ref = TableRef(table.schema, table.table)
        self.drain._write(self.window, ref, rows, self.stats, self.behind)

    def commit(self, commit_lsns: list[int]) -> WindowStats:
        """Write what is queued, wait for the writes, commit the window up to its boundary and
        advance the slot; ``commit_lsns`` loses the transactions the window holds."""
        if self.top >= self.boundary:  # its end would confirm a transaction not all stored
            raise RuntimeError(f"internal error: window {self.stats.start}..{LSN(self.boundary)} "
                               f"holds rows of a transaction committing at {LSN(self.top)}; "
                               f"nothing of it was committed")  # fmt: skip
        for queued in self.pending.values():
            if queued:
                self._write(queued)
        self.behind.finish()
        held = sum(1 for lsn in commit_lsns if lsn < self.boundary)
        del commit_lsns[:held]
        self.stats.transactions = held
        self.stats.end = LSN(self.boundary)
        stats = self.drain._commit(self.window, self.stats, self.began)
        if self.follow is not None:
            self.follow.windows += 1
            self.follow.freshness.add(_freshness(self.commits, time.time()))
        log_window(stats, self.drain.run_end)
        return stats

    def age(self) -> float:
        """Seconds since the window was opened (the last commit, in a following run)."""
        return time.monotonic() - self.began

    def abandon(self) -> None:
        """A failure: let the writes in flight end; nothing of the window is committed."""
        self.behind.close()


def _commit_times(rows: Any) -> tuple[Any, Any]:
    """The commit LSN and time of each transaction with rows in ``rows`` (ordered by commit)."""
    import numpy as np

    lsns = rows.column(COMMIT_LSN).to_numpy()
    firsts = np.flatnonzero(np.diff(lsns, prepend=-1))
    return lsns[firsts], rows.column(COMMIT_TS).to_numpy()[firsts]


def _freshness(commits: list[tuple[Any, Any]], readable_at: float) -> Any:
    """Each transaction's freshness (once, though its rows span tables and batches)."""
    import numpy as np

    if not commits:
        return np.zeros(0)
    lsns = np.concatenate([c[0] for c in commits])
    times = np.concatenate([c[1] for c in commits])
    _, firsts = np.unique(lsns, return_index=True)
    return freshness_of(times[firsts], readable_at)


def through_first_commit(data: Any, wal_end: LSN | None) -> tuple[Any, LSN | None]:
    """``data`` (a batch of messages) up to and including its first Commit, with where that
    Commit's record ends (every transaction before it has then been read whole); ``data``
    and ``wal_end`` as they are when it holds none."""
    import numpy as np

    from airflow_pglogrepl.pgoutput import layouts as lay
    from airflow_pglogrepl.pgoutput.columnar import buffers

    if not len(data):
        return data, wal_end
    buf, starts, ends = buffers(data)
    commits = np.flatnonzero((buf[starts] == lay.COMMIT) & (ends - starts == lay.COMMIT_SIZE))
    if not len(commits):
        return data, wal_end
    first = int(commits[0])
    at = int(starts[first]) + lay.COMMIT_LSN + 8  # the end LSN follows the commit LSN
    return data.slice(0, first + 1), LSN(int.from_bytes(buf[at : at + 8].tobytes(), "big"))
