"""The last stage of a window: its rows written into the lake, the window committed, and only
then the slot told it may forget them.

Both decoders (the columnar windows and the per-message ones) hand their rows here, and every
window ends here: ``commit`` is the one place where the lake's commit and the slot's move
follow each other, in that order. Where the slot moves depends on the reader (``readers``): a
peek's run advances it (``pg_replication_slot_advance``), a stream's confirms the position to
its walsender. The rule is the same: never past what the lake holds durably.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import PublicationNotFoundError
from airflow_pglogrepl.faults import fault, pause
from airflow_pglogrepl.lake import opened_tables
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lake.opened_tables import Opened
    from airflow_pglogrepl.pgoutput import TableInfo
    from airflow_pglogrepl.pipeline.overlap import Behind
    from airflow_pglogrepl.pipeline.results import WindowStats
    from airflow_pglogrepl.pipeline.source import DrainSource

__all__ = ["Confirm", "WindowCommitter"]

# Where a committed window's end goes: the slot's advance, or the stream's confirm
Confirm = Callable[[LSN], object]


class WindowCommitter:
    """Writes windows' rows into ``lake`` and commits them, moving ``slot`` after each commit.

    ``confirm`` is where a committed window's end goes: by default the slot's advance (a peek's
    run); a stream's reader puts its own confirm there while it reads (``confirming``).
    ``batch_rows``: rows of one table a window writes at a time.
    """

    def __init__(self, *, source: DrainSource, lake: Lake, slot: str,
                 publications: Sequence[str], batch_rows: int) -> None:  # fmt: skip
        self.source = source
        self.lake = lake
        self.slot = slot
        self.publications = list(publications)
        self.batch_rows = batch_rows
        self.run_end = LSN(0)  # the WAL position the run drains to (what each window's log says)
        self.confirm: Confirm = self._advance
        # called with each committed window's end, once the slot moved (``pipeline.repair``)
        self.after_commit: Callable[[LSN], None] | None = None

    def open(self, start: LSN) -> Window:
        """A new window of the lake from ``start``."""
        return Window(self.lake, start)

    def floor(self, floors: dict[int, int], table: TableInfo, start: LSN) -> int:
        """``Lake.floor`` of ``table`` (0: nothing of it is in the lake yet), looked up once per
        table description and window (``floors``): applied before the rows are converted and
        counted, and again by the window before it writes."""
        floor = floors.get(id(table))
        if floor is None:
            floor = floors[id(table)] = self.lake.floor(TableRef(table.schema, table.table), start)
        return floor

    def write(self, window: Window, ref: TableRef, rows: Any, stats: WindowStats,
              behind: Behind | None = None) -> None:  # fmt: skip
        """Write rows of one table into the window: now, or in ``behind``'s thread."""
        name = str(ref)
        stats.tables[name] = stats.tables.get(name, 0) + rows.num_rows
        if behind is None:
            store(window, ref, rows)
        else:
            behind.submit(store, window, ref, rows, opened_tables.for_another_thread())

    def require_publications(self) -> None:
        """Refuse to go on when a publication of the drain is missing."""
        missing = self.source.missing_publications(self.publications)
        if missing:
            raise PublicationNotFoundError(missing, self.slot)

    def commit(self, window: Window, stats: WindowStats, began: float) -> WindowStats:
        """Commit the window to the lake, then, and only then, move the slot to its end."""
        fault("after_write")
        # PostgreSQL 18 only warns about a missing publication and decodes nothing of it: a
        # window read without one must not commit, or the slot would move past its changes.
        self.require_publications()
        pause("before_commit")
        window.commit(stats.end, transactions=stats.transactions, changes=stats.changes)
        fault("after_commit")
        # The window is durable in the lake: only now may the slot forget it, and only while
        # this run still holds the lake (another writer may have drained on from here).
        self.lake.check_writer()
        self.confirm(stats.end)
        stats.seconds = time.monotonic() - began
        if self.after_commit is not None:
            self.after_commit(stats.end)
        return stats

    @contextlib.contextmanager
    def confirming(self, confirm: Confirm) -> Iterator[None]:
        """``confirm`` takes the ends of the windows committed inside the block (a reader's)."""
        before, self.confirm = self.confirm, confirm
        try:
            yield
        finally:
            self.confirm = before

    def _advance(self, end: LSN) -> None:
        self.source.advance_slot(self.slot, end)


def store(window: Window, ref: TableRef, rows: Any, tables: Opened | None = None) -> None:
    """One table's rows into ``window`` (in the writer's thread, behind the decoder, with the
    tables the run keeps open for that thread: ``lake.opened_tables``)."""
    with opened_tables.reused(tables):
        window.write(ref, rows)
    fault("mid_write")
