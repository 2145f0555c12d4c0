"""The per-message path's windows: a peek's rows decoded message by message (``pgoutput``'s
``PgOutputStream``), each window written and committed on its own.

The path the columnar windows (``windows``) hand a window to when they decline it (a type they
do not take, a table's error), and the one that holds tables in the lake's quarantine: a table
whose changes cannot be stored is held (``lake.quarantine``) and the window read again without
it, nothing of the failed attempt committed, so every other table goes on.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.rows import ChangelogBatch
from airflow_pglogrepl.lake.quarantine import TABLE_ERRORS, Cause, cause_of
from airflow_pglogrepl.lake.quarantine import rows as quarantine_rows
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import Change, PgOutputStream, TransactionCommit
from airflow_pglogrepl.pipeline.results import WindowStats
from airflow_pglogrepl.pipeline.windows import QUEUE_BYTES, window_end
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.pipeline.committer import WindowCommitter

__all__ = ["MessageWindows"]

log = logging.getLogger("airflow_pglogrepl.drain")

# Rows of the peek's result fetched at a time: libpq holds a fetched chunk whole, so this and
# the rows' size bound the client's memory (200,000 rows of 16 KiB, the default batch_rows,
# held a 700 MiB transaction at once).
FETCH_ROWS = 5_000


class MessageWindows:
    """Windows read by peeks and decoded per message, committed through ``committer``.

    ``held``: the tables in the lake's quarantine (their changes go there, not to
    ``changes/``), grown by ``window`` when ``quarantine`` is on; ``options``: pgoutput's.
    """

    def __init__(self, committer: WindowCommitter, options: Mapping[str, str], *,
                 held: dict[TableRef, Cause], quarantine: bool) -> None:  # fmt: skip
        self.committer = committer
        self.options = options
        self.held = held
        self.quarantine = quarantine

    def window(self, start: LSN, end: LSN, *, next_commit: bool) -> WindowStats:
        """The window ``[start, end)`` (``next_commit``: up to the next commit only), committed.
        A table whose changes cannot be stored is put in the quarantine (``held``) and the
        window read again without it, nothing of the failed attempt committed."""
        while True:
            try:
                return self._window(start, end, next_commit=next_commit)
            except TABLE_ERRORS as exc:
                ref = getattr(exc, "ref", None)
                if not self.quarantine or ref is None or ref in self.held:
                    raise
                self.held[ref] = cause_of(exc, str(start))
                log.warning("%s goes to the lake's quarantine from %s, every other table goes "
                            "on: %s: %s", ref, start, type(exc).__name__,
                            getattr(exc, "what", exc))  # fmt: skip

    def _window(self, start: LSN, end: LSN, *, next_commit: bool = False) -> WindowStats:
        began = time.monotonic()
        stats = WindowStats(start=start, end=end)
        window = self.committer.open(start)
        batches: dict[int, ChangelogBatch] = {}
        stream = PgOutputStream.from_options(self.options)
        read = [0]  # bytes of messages read so far
        rows = _counted(self.committer.source.peek_changes(
            self.committer.slot,
            upto_lsn=end,
            options=self.options,
            batch_rows=min(self.committer.batch_rows, FETCH_ROWS),
            upto_nchanges=1 if next_commit else None,
        ), read)  # fmt: skip
        written_at = 0
        last_commit: TransactionCommit | None = None
        floors: dict[int, int] = {}
        quarantined: dict[TableRef, list[Change]] = {}
        for event in stream.decode(rows):
            if event.__class__ is Change:
                change: Change = event
                floor = self.committer.floor(floors, change.table, start)
                if floor and int(change.commit_lsn or 0) < floor:
                    # The table's state already holds this change (a re-snapshot after it):
                    # skipped before its values are even converted, so a value the lake
                    # could not store no longer stops the drain once the row is corrected.
                    continue
                stats.changes += 1
                if self.held:
                    ref = TableRef(change.table.schema, change.table.table)
                    if ref in self.held:  # as sent, not converted
                        quarantined.setdefault(ref, []).append(change)
                        continue
                batch = batches.get(id(change.table))
                if batch is None:
                    batch = batches[id(change.table)] = ChangelogBatch(change.table)
                with _naming(batch.ref):
                    batch.add(change, change.seq)
                if len(batch) >= self.committer.batch_rows:
                    with _naming(batch.ref):
                        self.committer.write(window, batch.ref, batch.to_arrow(), stats)
                    batches[id(change.table)] = ChangelogBatch(change.table)
                elif read[0] - written_at >= QUEUE_BYTES:  # wide rows: bounded by bytes too
                    for key, queued in list(batches.items()):
                        if len(queued):
                            with _naming(queued.ref):
                                self.committer.write(window, queued.ref, queued.to_arrow(), stats)
                            batches[key] = ChangelogBatch(queued.table)
                    written_at = read[0]
            elif event.__class__ is TransactionCommit:
                stats.transactions += 1
                last_commit = event
        for batch in batches.values():
            if len(batch):
                with _naming(batch.ref):
                    self.committer.write(window, batch.ref, batch.to_arrow(), stats)
        if last_commit is not None:
            if next_commit and last_commit.end_lsn < end:
                end = last_commit.end_lsn  # the window ends just past the one commit it holds
            end = stats.end = window_end(end, [int(last_commit.commit_lsn or 0)])
        for ref, changes in quarantined.items():
            window.quarantine(quarantine_rows(ref, changes, self.held[ref], str(start),
                                              str(stats.end)))  # fmt: skip
            stats.quarantined[str(ref)] = len(changes)
        return self.committer.commit(window, stats, began)


def _counted(
    rows: Iterator[tuple[Any, Any, Any]], read: list[int]
) -> Iterator[tuple[Any, Any, Any]]:
    """The peek's rows, adding the bytes of each message to ``read[0]`` as it passes."""
    for row in rows:
        read[0] += len(row[2])
        yield row


@contextlib.contextmanager
def _naming(ref: TableRef) -> Iterator[None]:
    """A table's error raised inside carries the table it is of (``ref``): what the lake's
    quarantine holds it by."""
    try:
        yield
    except TABLE_ERRORS as exc:
        exc.ref = ref  # type: ignore[union-attr]
        raise
