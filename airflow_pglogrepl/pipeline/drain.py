"""Drain one logical slot into the lake in bounded LSN windows, exactly once.

Window ``[start, end)`` holds the transactions whose commit record starts before ``end``:
``pg_logical_slot_peek_binary_changes(slot, end, ...)`` decodes WAL records until one reaches
``end`` and returns whole transactions, and after the slot is advanced to ``end`` the server skips
exactly those commits (their commit starts before ``confirmed_flush_lsn``). So consecutive
windows neither overlap nor leave gaps, and an empty window (no published change, or a
transaction still open across ``end``) may still advance the slot: an idle publication never pins
WAL. A transaction bigger than a window comes back whole in the window holding its commit.
One exception: an ``end`` inside a WAL page's header lets the peek return the commit right after
that header, and the window then ends just past it (``window_end``).

Each window is written through the lake's window API (``airflow_pglogrepl.lake.window``, where
the crash-safety argument is written down): batches as they fill, one Delta commit per touched
table and one for the window at its end. Only after that commit returns is the slot advanced
(``pg_replication_slot_advance``).

At start the lake's position is compared with the slot's ``confirmed_flush_lsn``: lake ahead
means an advance was lost (PostgreSQL persists an advanced position only at the next checkpoint),
so the slot is moved up to the lake; slot ahead means someone else consumed changes the lake never
saw, and the run stops, naming both LSNs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from airflow_pglogrepl.changelog.columnar import (
    ColumnarUnsupportedError,
)
from airflow_pglogrepl.changelog.rows import ChangelogBatch
from airflow_pglogrepl.exceptions import (
    ArrowPeekError,
    LakeFromAnotherSourceError,
    LakeSnapshotUnfinishedError,
    PublicationNotFoundError,
    SlotAheadOfLakeError,
)
from airflow_pglogrepl.faults import fault, pause
from airflow_pglogrepl.lake.in_progress import InProgressTransactions
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.quarantine import TABLE_ERRORS, Cause, cause_of, held
from airflow_pglogrepl.lake.quarantine import rows as quarantine_rows
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.names import publication_names_option
from airflow_pglogrepl.pgoutput import Change, PgOutputStream, TransactionCommit
from airflow_pglogrepl.pipeline.follow import Follow, following
from airflow_pglogrepl.pipeline.overlap import Behind, prefetched
from airflow_pglogrepl.pipeline.results import (
    READERS,
    DrainResult,
    WindowStats,
    committed,
    log_window,
)
from airflow_pglogrepl.pipeline.streamed import streamed
from airflow_pglogrepl.pipeline.windows import columnar_windows, window_end
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.pg.slot_stream import SlotStream
    from airflow_pglogrepl.models.records import SlotInfo
    from airflow_pglogrepl.pgoutput import TableInfo


class DrainSource(Protocol):
    """What the drain needs of its source database (``hooks.pg.source.PgSource``, or the Airflow
    hook, which has the same methods): read, peek and advance the slot, and the flush LSN."""

    def get_slot(self, name: str, *, plugin: str | None = None) -> SlotInfo: ...

    def advance_slot(self, name: str, upto: LSN | str) -> LSN: ...

    def flush_lsn(self) -> LSN: ...

    def missing_publications(self, names: Sequence[str]) -> list[str]: ...

    def source_identity(self) -> dict[str, object]: ...

    def peek_changes(
        self,
        slot: str,
        *,
        upto_lsn: LSN | str | None,
        options: Mapping[str, str],
        batch_rows: int = ...,
        upto_nchanges: int | None = ...,
    ) -> Iterator[tuple[LSN, int | None, Any]]: ...

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]: ...

    def stream_slot(
        self,
        slot: str,
        *,
        start: LSN,
        options: Mapping[str, str],
        alive: Callable[[], object] | None = None,
    ) -> SlotStream: ...


log = logging.getLogger("airflow_pglogrepl.drain")

# Windows one peek may serve (``Drain._columnar_span``). The server keeps a peek's whole result
# (spilled to a temporary file past work_mem) before it sends the first row: a few windows'
# worth, not a whole backlog.
PEEK_WINDOWS = 4


class Drain:
    """The drain loop: the slot's changes, window by window, into ``lake``."""

    def __init__(
        self,
        *,
        source: DrainSource,
        lake: Lake,
        slot: str,
        publications: Sequence[str],
        max_window_bytes: int,
        max_windows: int | None = None,
        batch_rows: int = 200_000,
        columnar: bool = True,
        accept_source_change: bool = False,
        quarantine: bool = True,
        reader: str = "auto",
        follow: Follow | None = None,
    ) -> None:
        if max_window_bytes <= 0:
            raise ValueError("max_window_bytes must be positive")
        if reader not in READERS:
            raise ValueError(f"reader must be one of {', '.join(READERS)}, got {reader!r}")
        # How the slot is read: "stream" (START_REPLICATION), "peek", or "auto": the stream
        # where it can be used, else the peek (``reader_note`` says why, in the summary).
        self.reader = reader
        # a following run (``pipeline.follow``): on until stopped or its bound, not to run_end
        self.follow = follow
        self.reader_used = "peek"
        self.reader_note: str | None = None
        self._stream: SlotStream | None = None  # while streaming: where windows are confirmed
        self.columnar = columnar
        # A table whose changes cannot be stored goes to the lake's quarantine, the others on
        # (``lake.quarantine``); False: the run fails on it, nothing of the window committed.
        self.quarantine = quarantine
        self.held: dict[TableRef, Cause] = {}  # tables in quarantine
        self.accept_source_change = accept_source_change
        self.run_end = LSN(0)  # the flushed WAL position a run drains to (set by ``run``)
        self.source = source
        self.lake = lake
        self.slot = slot
        self.publications = list(publications)
        self.max_window_bytes = max_window_bytes
        self.max_windows = max_windows
        self.batch_rows = batch_rows
        self.options = {
            "proto_version": "1",
            "publication_names": publication_names_option(self.publications),
            "messages": "false",
        }

    def run(self, started: float) -> DrainResult:
        """Reconcile the lake with the slot, then drain window by window."""
        if self.columnar:
            _preload()
        slot = check_slot(self.source, self.slot)
        self._require_publications()
        before = slot.confirmed_flush_lsn
        assert before is not None, "a logical slot always has confirmed_flush_lsn"
        self._claim()
        # Rows of transactions in progress a killed run kept: the next stream sends them again
        # from their start, and a run that peeks never needs them (``lake.in_progress``).
        InProgressTransactions(self.lake).clear()
        start = self._reconcile(before, self.lake.position())
        self.held = held(self.lake)
        if self.held:
            log.warning("tables in quarantine (their changes go there, not to changes/): %s",
                        {str(t): c.to_dict() for t, c in self.held.items()})  # fmt: skip
        run_end = self.run_end = self.source.flush_lsn()
        startup = time.monotonic() - started
        windows: list[WindowStats] = []
        if self.follow is not None:
            following(self, start, windows, self.follow)
        elif start < run_end:
            self.peeked(streamed(self, start, run_end, windows), run_end, windows)
        else:
            self.reader_used = "none"  # nothing to read: neither was opened
        after = self.source.get_slot(self.slot).confirmed_flush_lsn
        return DrainResult(
            slot=self.slot,
            windows=windows,
            confirmed_before=before,
            confirmed_after=after,
            run_end=self.run_end,
            startup_s=startup,
            lag_bytes_left=max(0, self.source.flush_lsn() - (after or self.run_end)),
            quarantined={str(table): cause.to_dict() for table, cause in self.held.items()},
            stored_as=dict(self.lake.stored_as),
            reader=self.reader_used,
            reader_note=self.reader_note,
            follow=self.follow.to_dict() if self.follow is not None else None,
        )

    def peeked(self, start: LSN, run_end: LSN, windows: list[WindowStats]) -> LSN:
        """The windows of ``[start, run_end)`` read by peeks, up to ``max_windows`` in all,
        appended to ``windows``; returns where they ended."""
        next_commit = False
        while (
            start < run_end
            and (self.max_windows is None or committed(windows) < self.max_windows)
            and not (self.follow is not None and self.follow.over())
        ):
            if self.columnar and not next_commit and not self.held:
                room = PEEK_WINDOWS
                if self.max_windows is not None:
                    room = min(room, self.max_windows - committed(windows))
                done: list[WindowStats] = []
                declined = False
                try:
                    self._columnar_span(start, min(run_end, start + self.max_window_bytes * room),
                                        done)  # fmt: skip
                except (ColumnarUnsupportedError, ArrowPeekError, *TABLE_ERRORS) as exc:
                    # (a table's error: the per-message path names its table, and holds it)
                    declined = True
                    log.info("window from %s: decoded per message (%s)",
                             done[-1].end if done else start, exc)  # fmt: skip
                windows.extend(done)  # each logged as it committed
                if done:
                    start = done[-1].end
                    next_commit = done[-1].transactions == 0
                if not declined:
                    continue
                if start >= run_end or (
                    self.max_windows is not None and committed(windows) >= self.max_windows
                ):
                    break
            end = run_end if next_commit else min(run_end, start + self.max_window_bytes)
            stats = self._held_window(start, end, next_commit=next_commit)
            windows.append(stats)
            log_window(stats, run_end)
            # A window without a single commit means the next commit is further away: a big
            # transaction still being written at the window's end, or only unpublished traffic.
            # Every peek decodes again from the slot's restart_lsn, which an open transaction
            # holds back, so stepping towards that commit window by window would re-decode the
            # transaction once per window. The next window is instead "up to the next commit":
            # exactly one transaction, however big, streamed through in batches (on the
            # per-message path, which holds such a transaction in less memory).
            next_commit = stats.transactions == 0
            start = stats.end
        return start

    def published_before(self, end: LSN) -> bool:
        """Whether the slot holds a published change before ``end`` (a peek of one)."""
        rows = self.source.peek_changes(self.slot, upto_lsn=end, options=self.options,
                                        upto_nchanges=1)  # fmt: skip
        try:
            return next(iter(rows), None) is not None
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()

    def _held_window(self, start: LSN, end: LSN, *, next_commit: bool) -> WindowStats:
        """A window on the per-message path; a table whose changes cannot be stored is put in
        the quarantine (``self.held``) and the window drained again without it, nothing of
        the failed attempt committed."""
        while True:
            try:
                return self._reference_window(start, end, next_commit=next_commit)
            except TABLE_ERRORS as exc:
                ref = getattr(exc, "ref", None)
                if not self.quarantine or ref is None or ref in self.held:
                    raise
                self.held[ref] = cause_of(exc, str(start))
                log.warning("%s goes to the lake's quarantine from %s, every other table goes "
                            "on: %s: %s", ref, start, type(exc).__name__,
                            getattr(exc, "what", exc))  # fmt: skip

    def _require_publications(self) -> None:
        missing = self.source.missing_publications(self.publications)
        if missing:
            raise PublicationNotFoundError(missing, self.slot)

    def _claim(self) -> None:
        """Refuse a lake of another slot, server or database, or one whose initial snapshot
        never committed, before anything is read or written; record the lake's identity at
        its first run (``Lake.claim``)."""
        identity = self.lake.claim(
            self.source.source_identity(),
            publications=self.publications,
            began_with="drain",
            accept_source_change=self.accept_source_change,
        )
        if identity.get("began_with") == "snapshot" and self.lake.position() is None:
            from airflow_pglogrepl.lake.snapshots import resolve

            left = resolve(self.lake).get("uncommitted_snapshots") or []
            raise LakeSnapshotUnfinishedError(
                self.lake.root, self.slot, identity.get("created_at"), left
            )

    def _reconcile(self, slot_lsn: LSN, lake_lsn: LSN | None) -> LSN:
        recorded = self.lake.recorded_source()
        current = self.lake.source or {}
        ahead = lake_lsn is not None and lake_lsn > slot_lsn
        changed = recorded is not None and (
            recorded.get("system_identifier") != current.get("system_identifier")
            or (ahead and recorded.get("timeline") != current.get("timeline"))
        )
        if changed and not self.accept_source_change:
            raise LakeFromAnotherSourceError(self.slot, self.lake.root, recorded or {}, current)
        if changed:
            log.warning(
                "lake %s was written from %s, the slot is on %s: draining on as asked "
                "(accept_source_change), and recording the new source", self.lake.root,
                recorded, current,
            )  # fmt: skip
        if ahead and recorded is None:
            log.warning(
                "lake %s records no source identity (its last commit predates them): "
                "advancing slot %s to it unchecked", self.lake.root, self.slot,
            )  # fmt: skip
        if lake_lsn is None:
            log.info("empty lake: starting at the slot's confirmed_flush_lsn %s", slot_lsn)
            return slot_lsn
        if lake_lsn > slot_lsn:
            log.warning(
                "lake is ahead of slot %s (%s > %s): the last advance was lost; advancing the "
                "slot to the lake, committed changes are not drained again",
                self.slot, lake_lsn, slot_lsn,
            )  # fmt: skip
            self.lake.check_writer()
            self.source.advance_slot(self.slot, lake_lsn)
            return lake_lsn
        if slot_lsn > lake_lsn:
            raise SlotAheadOfLakeError(self.slot, slot_lsn, lake_lsn, self.lake.root)
        return slot_lsn

    def _columnar_span(
        self,
        start: LSN,
        span_end: LSN,
        done: list[WindowStats],
        batches: Iterator[Any] | None = None,
        *,
        exact_end: bool = False,
        options: dict[str, str] | None = None,
    ) -> None:
        """The windows of ``[start, span_end)`` from one peek (or from ``batches`` of messages
        the stream sent), on the columnar path; each is appended to ``done`` once committed
        (and the slot advanced, or the stream confirmed, past it).

        ``exact_end``: the last window ends at ``span_end`` exactly, and rows that commit at
        or past it are left to the next run. A stream sends on past the span's end: the
        transactions there may be incomplete, and are sent again from the confirmed position.

        Every peek has the server decode from the slot's ``restart_lsn``, which moves only at
        the server's running-transactions records (every 15 s under load), so one peek per
        window can decode the same WAL again and again. One peek serves several windows: they
        are cut here at the same LSNs separate peeks would have ended at (a window holds the
        transactions whose commit record starts before its end), except that a window is never
        committed empty in the middle of a span: it grows to the next boundary instead.

        The window's stages overlap (``overlap``): the fetch runs ahead in a thread, the writes
        behind in another, the decoder in this one.
        """
        if batches is None:
            batches = prefetched(
                self.source.peek_arrow(self.slot, upto_lsn=span_end, options=self.options)
            )
        follow = self.follow if self._stream is not None else None  # a peek's end is fixed
        columnar_windows(self, start, span_end, done, batches, exact_end=exact_end,
                         follow=follow, options=options)  # fmt: skip

    def _reference_window(self, start: LSN, end: LSN, *, next_commit: bool = False) -> WindowStats:
        began = time.monotonic()
        stats = WindowStats(start=start, end=end)
        window = self.lake.open_window(start)
        batches: dict[int, ChangelogBatch] = {}
        stream = PgOutputStream.from_options(self.options)
        rows = self.source.peek_changes(
            self.slot,
            upto_lsn=end,
            options=self.options,
            batch_rows=self.batch_rows,
            upto_nchanges=1 if next_commit else None,
        )
        last_commit: TransactionCommit | None = None
        floors: dict[int, int] = {}
        quarantined: dict[TableRef, list[Change]] = {}
        for event in _events(stream, rows):
            if event.__class__ is Change:
                change: Change = event
                floor = self._floor(floors, change.table, start)
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
                if len(batch) >= self.batch_rows:
                    with _naming(batch.ref):
                        self._write(window, batch.ref, batch.to_arrow(), stats)
                    batches[id(change.table)] = ChangelogBatch(change.table)
            elif event.__class__ is TransactionCommit:
                stats.transactions += 1
                last_commit = event
        for batch in batches.values():
            if len(batch):
                with _naming(batch.ref):
                    self._write(window, batch.ref, batch.to_arrow(), stats)
        if last_commit is not None:
            if next_commit and last_commit.end_lsn < end:
                end = last_commit.end_lsn  # the window ends just past the one commit it holds
            end = stats.end = window_end(end, [int(last_commit.commit_lsn or 0)])
        for ref, changes in quarantined.items():
            window.quarantine(quarantine_rows(ref, changes, self.held[ref], str(start),
                                              str(stats.end)))  # fmt: skip
            stats.quarantined[str(ref)] = len(changes)
        return self._commit(window, stats, began)

    def _commit(self, window: Window, stats: WindowStats, began: float) -> WindowStats:
        """Commit the window to the lake, then, and only then, advance the slot to its end."""
        fault("after_write")
        # PostgreSQL 18 only warns about a missing publication and decodes nothing of it: a
        # window read without one must not commit, or the slot would move past its changes.
        self._require_publications()
        pause("before_commit")
        window.commit(stats.end, transactions=stats.transactions, changes=stats.changes)
        fault("after_commit")
        # The window is durable in the lake: only now may the slot forget it, and only while
        # this run still holds the lake (another writer may have drained on from here).
        self.lake.check_writer()
        if self._stream is not None:
            self._stream.confirm(stats.end)  # the slot's flushed position, sent at once
        else:
            self.source.advance_slot(self.slot, stats.end)
        stats.seconds = time.monotonic() - began
        return stats

    def _floor(self, floors: dict[int, int], table: TableInfo, start: LSN) -> int:
        """``Lake.floor`` of ``table`` (0: nothing of it is in the lake yet), looked up once per
        table description and window (``floors``): applied here before the rows are converted
        and counted, and again by the window before it writes."""
        floor = floors.get(id(table))
        if floor is None:
            floor = floors[id(table)] = self.lake.floor(TableRef(table.schema, table.table), start)
        return floor

    def _write(
        self,
        window: Window,
        ref: TableRef,
        rows: Any,
        stats: WindowStats,
        behind: Behind | None = None,
    ) -> None:
        """Write rows of one table into the window: now, or in ``behind``'s thread."""
        name = str(ref)
        stats.tables[name] = stats.tables.get(name, 0) + rows.num_rows
        if behind is None:
            _store(window, ref, rows)
        else:
            behind.submit(_store, window, ref, rows)


@contextlib.contextmanager
def _naming(ref: TableRef) -> Iterator[None]:
    """A table's error raised inside carries the table it is of (``ref``): what the lake's
    quarantine holds it by."""
    try:
        yield
    except TABLE_ERRORS as exc:
        exc.ref = ref  # type: ignore[union-attr]
        raise


def _preload() -> None:
    """Load the columnar path's libraries with the start-up, not inside the first window (whose
    time is the drain's rate). One that is missing is reported by the window that needs it."""
    import importlib

    for name in ("numpy", "pyarrow.compute", "pyarrow.parquet", "adbc_driver_postgresql.dbapi"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _store(window: Window, ref: TableRef, rows: Any) -> None:
    window.write(ref, rows)
    fault("mid_write")


def check_slot(source: DrainSource, slot_name: str) -> SlotInfo:
    """The slot, if it can be drained now: exists, pgoutput, and ``verdicts.drain_refusal``."""
    from airflow_pglogrepl.models.verdicts import drain_refusal

    slot = source.get_slot(slot_name, plugin="pgoutput")
    refusal = drain_refusal(slot)
    if refusal is not None:
        raise refusal
    return slot


def _events(stream: PgOutputStream, rows: Iterator[Any]) -> Iterator[Any]:
    yield from stream.decode(rows)
