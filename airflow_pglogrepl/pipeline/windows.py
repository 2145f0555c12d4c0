"""The columnar path's windows: batches of messages (from a peek or the stream) decoded and cut
into windows at LSN bounds, each written and committed on its own.

A window holds the transactions whose commit record starts before its end. The decoder hands
rows per table for a whole batch, so a window is cut only once every table's rows before its
end are added; its writes run behind in a thread of their own (``overlap.Behind``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columnar import ColumnarDecoder, InProgress, TablePiece
from airflow_pglogrepl.changelog.columns import COMMIT_LSN, COMMIT_TS
from airflow_pglogrepl.lake.in_progress import InProgressTransactions
from airflow_pglogrepl.lake.window import at_or_after
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.transaction_blocks import StreamAbort
from airflow_pglogrepl.pipeline.follow import Follow
from airflow_pglogrepl.pipeline.overlap import Behind
from airflow_pglogrepl.pipeline.results import WindowStats, fold_older, log_window
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.pipeline.committer import WindowCommitter

__all__ = ["ColumnarWindows", "OpenWindow", "through_first_commit", "window_end"]

QUEUE_BYTES = 64 << 20  # Arrow bytes of one table's rows a window queues before writing them


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


class ColumnarWindows:
    """Cuts batches of messages (in slot order, from a peek or the stream) into the windows of
    ``[start, span_end)``, committing each through ``committer`` and appending it to ``done``.

    ``exact_end``: the last window ends at ``span_end`` exactly, and rows that commit at or past
    it are left to the next run (a stream sends on past the span's end).

    A stream's batches come as ``(messages, wal_end)``: every transaction that commits before
    ``wal_end`` has been sent, so each window that ends at or before it is committed then, empty
    or not. Through unpublished traffic the slot so moves window by window, as with peeks,
    instead of at the run's end only; such windows double in size each time, so the slot moves
    on in a few commits however far it goes.

    ``follow`` (a following run, ``pipeline.follow``): the stream's items may also be
    ``(None, None)``, a tick of the clock while nothing came. A window holding changes is also
    committed once ``follow.window_s`` has passed since the last commit, and the run ends, its
    last window committed, once ``follow.over``; either cut is at the highest WAL end the server
    has sent, before which every transaction was sent whole.

    ``options``: pgoutput's, the stream's when it asked for ``streaming 'on'``: a transaction
    sent while still in progress waits in the lake (``lake.in_progress``) until its Stream
    Commit, then joins the windows in its commit's place, a file at a time.
    """

    def __init__(self, committer: WindowCommitter, *, start: LSN, span_end: LSN,
                 window_bytes: int, options: Mapping[str, str], exact_end: bool,
                 follow: Follow | None = None) -> None:  # fmt: skip
        self.committer = committer
        self.start = start
        self.last = int(span_end)
        self.window_bytes = window_bytes
        self.exact_end = exact_end
        self.follow = follow
        self.decoder = ColumnarDecoder(dict(options))
        self.floors: dict[int, int] = {}
        self.done: list[WindowStats] = []
        self.sent = int(start)  # every transaction committing before it has been read (stream)
        self.empty_bytes = window_bytes  # the next empty window's size (doubles, see above)
        self.in_progress = None
        if self.decoder.streams:  # (what an earlier run left there was removed as it began)
            self.in_progress = InProgressTransactions(committer.lake)
        self.current = self._open(start, min(self.last, int(start) + window_bytes))

    def run(self, fetched: Any, done: list[WindowStats]) -> None:
        """Read ``fetched`` to its end (or a following run's stop), committing windows into
        ``done`` as they are cut. ``fetched`` is closed on a failure."""
        self.done = done
        cut_short = True  # until the stream's end, or the run's stop, is reached
        try:
            for item in fetched:
                data, wal_end = item if isinstance(item, tuple) else (item, None)
                if self.follow is not None and data is not None and self.follow.over():
                    # Stopping with a transaction read in part: read it to its Commit, and no
                    # further (the rest is sent again to the next run), then cut past it.
                    data, wal_end = through_first_commit(data, wal_end)
                if wal_end is not None:
                    self.sent = max(self.sent, int(wal_end))
                self._decode(data)
                if wal_end is not None:
                    self._cut_to_wal_end(int(wal_end))
                if self.follow is not None and self._cut_following(self.follow):
                    return  # (cut short: the walsender lags the source, a commit may be near)
            if self.follow is not None:  # the stream ended without an error: only a close does
                self.current.abandon()
                return
            cut_short = False
            self._finish()
        except BaseException:
            fetched.close()
            self.current.abandon()
            raise
        finally:
            if self.in_progress is not None:  # what is still in progress is sent again
                self.in_progress.report(cut_short=cut_short)
                self.in_progress.clear()

    def _open(self, start: LSN | int, boundary: int) -> OpenWindow:
        return OpenWindow(self.committer, LSN(start), boundary, self.follow)

    def _commit(self) -> None:
        self.done.append(self.current.commit(self.decoder.commit_lsns))

    def _decode(self, data: Any) -> None:
        """Decode one batch and place its rows; in-progress transactions wait in the lake."""
        for part in self.decoder.parts(data) if data is not None else ():
            if isinstance(part, list):
                self._place(part)
                continue
            assert self.in_progress is not None
            if isinstance(part, InProgress):
                self.in_progress.add(part)
            elif isinstance(part, StreamAbort):
                self.in_progress.abort(part.xid, part.subxid)
            else:  # a Stream Commit: its rows, a file at a time, in its commit's place
                for piece in self.in_progress.commit(part):
                    self._place([piece])

    def _place(self, batch_pieces: list[TablePiece]) -> None:
        """Add rows to the windows they belong to, committing each window left behind. A batch
        holds one piece per table, each with its rows of every transaction in the batch: a
        window is cut only once all pieces' rows before it are added."""
        import numpy as np

        pieces = []
        for piece in batch_pieces:
            rows = piece.rows
            floor = self.committer.floor(self.floors, piece.table, self.start)
            if floor:  # rows the table's state already holds (a re-snapshot after them)
                rows = at_or_after(rows, floor)
            if self.exact_end and rows.num_rows:  # rows past the span: the next run's
                past = rows.column(COMMIT_LSN).to_numpy()
                rows = rows.slice(0, int(np.searchsorted(past, self.last)))
            if rows.num_rows:
                pieces.append((piece.table, rows, rows.column(COMMIT_LSN).to_numpy()))
        while pieces:
            self._cut_before(min(int(lsns[0]) for _, _, lsns in pieces))
            rest = []
            for table, rows, lsns in pieces:
                split = int(np.searchsorted(lsns, self.current.boundary))
                self.current.add(TablePiece(table, rows.slice(0, split)))
                if split < len(lsns):
                    rest.append((table, rows.slice(split), lsns[split:]))
            pieces = rest

    def _cut_before(self, first: int) -> None:
        """Make the window in hand the one that takes rows committing at ``first``: commit it
        when it ends before them and holds a transaction, else grow it (never committed empty
        in the middle of a span)."""
        current = self.current
        if first >= self.last:  # a commit the peek read past its end (``window_end``)
            current.boundary = int(window_end(self.last, [first]))
        elif first >= current.boundary:
            if any(c < current.boundary for c in self.decoder.commit_lsns):
                self._commit()
                current = self.current = self._open(current.boundary, current.boundary)
            while first >= current.boundary:
                current.boundary += self.window_bytes
            current.boundary = min(current.boundary, self.last)

    def _cut_to_wal_end(self, wal_end: int) -> None:
        """Commit every window that ends at or before ``wal_end`` (a stream's), empty or not."""
        while self.current.boundary <= wal_end and self.current.boundary < self.last:
            current = self.current
            if not current.stats.changes and not any(
                c < current.boundary for c in self.decoder.commit_lsns
            ):  # nothing published: one window up to what was sent, twice the last's size
                if wal_end >= self.last or wal_end - int(current.stats.start) < self.empty_bytes:
                    break  # (the window ending at ``last`` is the run's last: ``_finish``)
                current.boundary = wal_end
                self.empty_bytes *= 2
            else:
                self.empty_bytes = self.window_bytes
            self._commit()
            step = min(self.last, current.boundary + self.window_bytes)
            self.current = self._open(current.boundary, step)

    def _cut_following(self, follow: Follow) -> bool:
        """A following run's cuts: by time while changes come, and at its stop; True once the
        run is over (its last window committed)."""
        self.committer.run_end = LSN(max(int(self.committer.run_end), self.sent))
        over = follow.over()
        current = self.current
        if over or (current.stats.changes and current.age() >= follow.window_s):
            # Cut where every transaction before has been read whole: at the highest WAL end
            # sent, once that is past every row the window holds. A transaction read in part
            # (its rows are placed batch by batch) holds the cut back until its Commit is read,
            # a stop too: its rest is on the way.
            cut = min(current.boundary, self.sent)
            if cut > int(current.stats.start) and cut > current.top:
                current.boundary = cut
                self._commit()
                fold_older(self.done)  # a run of days: a bounded record of its windows
                current = self.current = self._open(cut, min(self.last, cut + self.window_bytes))
            if over and not current.stats.changes:
                current.abandon()  # nothing of it was read
                return True
        if not current.stats.changes:  # (nothing in hand: the windows before wait for a merge)
            follow.merge_if_due()
        return False

    def _finish(self) -> None:
        """The span's last window, past a commit read past its end even when the table floors
        left none of its rows."""
        if self.exact_end:
            self.current.boundary = self.last
        else:
            self.current.boundary = int(
                window_end(max(self.current.boundary, self.last), self.decoder.commit_lsns)
            )
        self._commit()


class OpenWindow:
    """A columnar window being filled: its queued pieces per table, its writer, its boundary
    (the LSN its transactions' commit records start before). In a following run (``follow``)
    it also keeps its transactions' commit times, for their freshness."""

    def __init__(
        self, committer: WindowCommitter, start: LSN, boundary: int, follow: Follow | None = None
    ) -> None:
        self.committer = committer
        self.follow = follow
        self.commits: list[tuple[Any, Any]] = []  # (commit LSNs, commit times), following
        self.began = time.monotonic()
        self.top = -1  # the highest commit LSN of the rows added: the window must end past it
        self.stats = WindowStats(start=start, end=start, decoder="columnar")
        self.window = committer.open(start)
        self.boundary = boundary
        self.behind = Behind()
        self.pending: dict[int, list[TablePiece]] = {}  # relation OID -> one description's
        self.queued_rows: dict[int, int] = {}
        self.queued_bytes: dict[int, int] = {}

    def add(self, piece: TablePiece) -> None:
        """Queue rows of the window; a table's queue is written once it holds ``batch_rows``
        or ``QUEUE_BYTES`` of Arrow data (rows of 16 KiB made 200,000 rows 3 GB: a transaction
        bigger than a window, joining it a file at a time, was held whole), or when the table's
        description changes (the older rows first)."""
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
            self.queued_rows[relid] = self.queued_bytes[relid] = 0
        queued.append(piece)
        self.queued_rows[relid] = self.queued_rows.get(relid, 0) + rows
        self.queued_bytes[relid] = self.queued_bytes.get(relid, 0) + piece.rows.nbytes
        if (self.queued_rows[relid] >= self.committer.batch_rows
                or self.queued_bytes[relid] >= QUEUE_BYTES):  # fmt: skip
            self._write(queued)
            self.queued_rows[relid] = self.queued_bytes[relid] = 0

    def _write(self, pieces: list[TablePiece]) -> None:
        """Hand one table description's queued pieces to the writer (and empty the queue)."""
        import pyarrow as pa

        table = pieces[0].table
        rows = pa.concat_tables([p.rows for p in pieces]) if len(pieces) > 1 else pieces[0].rows
        pieces.clear()
        ref = TableRef(table.schema, table.table)
        self.committer.write(self.window, ref, rows, self.stats, self.behind)

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
        stats = self.committer.commit(self.window, self.stats, self.began)
        if self.follow is not None:
            self.follow.committed(_first_commit_times(self.commits), time.time())
        log_window(stats, self.committer.run_end)
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


def _first_commit_times(commits: list[tuple[Any, Any]]) -> Any:
    """Each transaction's commit time, once (though its rows span tables and batches)."""
    import numpy as np

    if not commits:
        return np.zeros(0, dtype="datetime64[us]")
    lsns = np.concatenate([c[0] for c in commits])
    times = np.concatenate([c[1] for c in commits])
    _, firsts = np.unique(lsns, return_index=True)
    return times[firsts]


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
