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

At start the lake's position is compared with the slot's (``reconcile``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_pglogrepl.changelog.columnar import ColumnarUnsupportedError
from airflow_pglogrepl.exceptions import (
    ArrowPeekError,
    SlotStreamError,
)
from airflow_pglogrepl.lake import opened_tables
from airflow_pglogrepl.lake.coverage import Gap
from airflow_pglogrepl.lake.in_progress import InProgressTransactions
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.quarantine import TABLE_ERRORS, Cause, held
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.committer import WindowCommitter
from airflow_pglogrepl.pipeline.coverage import CoverageCheck
from airflow_pglogrepl.pipeline.follow import NO_END, REOPEN_MAX_S, Follow
from airflow_pglogrepl.pipeline.message_windows import MessageWindows
from airflow_pglogrepl.pipeline.reader_choice import peek_or_stream
from airflow_pglogrepl.pipeline.readers import (
    PeekReader,
    SlotReader,
    peek_options,
    published_before,
)
from airflow_pglogrepl.pipeline.reconcile import claim, reconcile
from airflow_pglogrepl.pipeline.repair import Repair, asked_gap, go_on
from airflow_pglogrepl.pipeline.results import (
    READERS,
    DrainResult,
    WindowStats,
    committed,
    cpu_s,
    fold_older,
    log_window,
)
from airflow_pglogrepl.pipeline.source import DrainSource, check_slot, standbys_streaming
from airflow_pglogrepl.pipeline.stream_phase import StreamPhase
from airflow_pglogrepl.pipeline.windows import ColumnarWindows
from airflow_pglogrepl.tables import TableRef

__all__ = ["PEEK_WINDOWS", "Drain", "DrainSource", "check_slot"]

log = logging.getLogger("airflow_pglogrepl.drain")

# Windows one peek may serve (``Drain._columnar_span``). The server keeps a peek's whole result
# (spilled to a temporary file past work_mem) before it sends the first row: a few windows'
# worth, not a whole backlog.
PEEK_WINDOWS = 4


class Drain:
    """The drain loop: the slot's changes, window by window, into ``lake``.

    The stages go one way: a reader (``readers``: the stream, or peeks) gives batches of
    messages; the columnar windows (``windows``), or the per-message ones (``message_windows``)
    for what those decline, decode them and cut windows; the committer (``committer``) writes
    each window, commits it and moves the slot. This class only decides which reader and which
    windows, and in what order; ``follow`` makes the run a following one.
    """

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
        accept_incomplete: Sequence[str] = (),
        repair: Repair | None = None,
    ) -> None:
        if max_window_bytes <= 0:
            raise ValueError("max_window_bytes must be positive")
        if reader not in READERS:
            raise ValueError(f"reader must be one of {', '.join(READERS)}, got {reader!r}")
        # How the slot is read: "stream" (START_REPLICATION), "peek", or "auto": peeks for a
        # backlog, the stream when following or when the slot's restart_lsn is pinned far
        # behind (``reader_choice``; ``reader_note`` says why, in the summary).
        self.reader = reader
        self._stream_tried = False  # "auto": the stream was chosen once this run
        # a following run (``pipeline.follow``): on until stopped or its bound, not to run_end
        self.follow = follow
        self.reader_used = "peek"
        self.reader_note: str | None = None
        self.stream_opened = False  # whether the last stream asked for was opened
        self.columnar = columnar
        self.held: dict[TableRef, Cause] = {}  # tables in quarantine (``lake.quarantine``)
        self.accept_source_change = accept_source_change
        # tables whose difference from the source the user accepts (``pipeline.coverage``)
        self.accept_incomplete = list(accept_incomplete)
        # what repairs the tables the check names (None: they are only named): the run calls
        # it before it reads the slot and after each window (``pipeline.repair``)
        self.repair = repair
        self.source = source
        self.lake = lake
        self.slot = slot
        self.publications = list(publications)
        self.max_window_bytes = max_window_bytes
        self.max_windows = max_windows
        self.batch_rows = batch_rows
        self.options = peek_options(self.publications)
        self.committer = WindowCommitter(source=source, lake=lake, slot=slot,
                                         publications=self.publications,
                                         batch_rows=batch_rows)  # fmt: skip
        # A table whose changes cannot be stored goes to the lake's quarantine, the others on;
        # quarantine=False: the run fails on it, nothing of the window committed.
        self._messages = MessageWindows(self.committer, self.options, held=self.held,
                                        quarantine=quarantine)  # fmt: skip
        self._peek = PeekReader(source, slot, self.options)
        self._failover = False  # the slot is a failover slot (``run`` reads it)

    @property
    def run_end(self) -> LSN:
        """The flushed WAL position the run drains to (a following run: the highest sent)."""
        return self.committer.run_end

    @opened_tables.reused()
    def run(self, started: float) -> DrainResult:
        """Reconcile the lake with the slot, then drain window by window (each table's log read
        once in the run: ``lake.opened_tables``)."""
        if self.columnar:
            _preload()
        slot = check_slot(self.source, self.slot, self.lake)
        self._failover = bool(slot.failover)
        self.committer.require_publications()
        before = slot.confirmed_flush_lsn
        assert before is not None, "a logical slot always has confirmed_flush_lsn"
        claim(self.lake, self.source, self.slot, self.publications,
              accept_source_change=self.accept_source_change)  # fmt: skip
        self._stream_tried = False
        self.reader_used, self.reader_note = "peek", None
        # Rows of transactions in progress a killed run kept: the next stream sends them again
        # from their start, and a run that peeks never needs them (``lake.in_progress``).
        InProgressTransactions(self.lake).clear()
        start = reconcile(self.lake, self.source, self.slot, before,
                          accept_source_change=self.accept_source_change,
                          publications=self.publications)  # fmt: skip
        self.held.clear()  # (a Drain run again: what is held now, not what was)
        self.held.update(held(self.lake))
        if self.held:
            log.warning("tables in quarantine (their changes go there, not to changes/): %s",
                        {str(t): c.to_dict() for t, c in self.held.items()})  # fmt: skip
        gaps = CoverageCheck(self.source, self.lake, self.publications,
                             accept=self.accept_incomplete).run()  # fmt: skip
        unrepaired: dict[str, str] = {}
        backfilling: dict[str, Gap] = {}
        windows: list[WindowStats] = []
        try:  # (the repair may start a step in the background from its first call on)
            if self.repair is not None:
                self._repair(gaps, unrepaired, backfilling)
            run_end = self.committer.run_end = self.source.flush_lsn()
            startup = time.monotonic() - started
            self._read(start, run_end, windows)
        except BaseException:
            self._settle(failed=True)
            raise
        self._settle(failed=False)
        if self.repair is not None:
            position = str(self.lake.position())
            for table in unrepaired:  # asked for (a resync, a parity check), and refused
                gaps.setdefault(table, asked_gap(table, "resync or parity check", position))
            for table, shown in self.repair.report().items():
                if "error" not in shown:
                    continue
                gaps[table] = backfilling.get(table) or asked_gap(table, shown["why"], position)
                unrepaired[table] = shown["error"]
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
            incomplete=_incomplete(gaps, unrepaired),
            backfills=self.repair.report() if self.repair is not None else {},
            parity=self.repair.parity_report() if self.repair is not None else {},
        )

    def _repair(self, gaps: dict[str, Gap], unrepaired: dict[str, str],
                backfilling: dict[str, Gap]) -> None:  # fmt: skip
        """Hand the gaps to the repair: those it made whole leave ``gaps``, those it could not
        go to ``unrepaired``, those it goes on with to ``backfilling``."""
        assert self.repair is not None
        for table, why in self.repair(gaps).items():
            if why is None:
                gaps.pop(table, None)
            else:
                unrepaired[table] = why
        for table in self.repair.in_progress():  # reported as backfills, not failed
            if table in gaps and table not in unrepaired:
                backfilling[table] = gaps.pop(table)
        self.committer.after_commit = self.repair.after_window

    def _read(self, start: LSN, run_end: LSN, windows: list[WindowStats]) -> None:
        """The run's windows, then its repair's rounds."""
        if self.follow is not None:
            self._following(start, windows, self.follow)
        elif start < run_end:
            self._read_span(start, run_end, windows)
        else:
            self.reader_used = "none"  # nothing to read: neither was opened
        if self.follow is None and self.max_windows is None:
            go_on(self.repair, lake=self.lake, source=self.source,
                  drained=committed(windows) > 0,
                  drain=lambda start, end: self._drain_more(start, end, windows))  # fmt: skip

    def _settle(self, *, failed: bool) -> None:
        """Whatever happened, the repair's step in the background (a backfill's build) has
        ended when this returns: the run's lock is released after it."""
        self.committer.after_commit = None
        if self.repair is not None:
            self.repair.settle(failed=failed)

    def _drain_more(self, start: LSN, end: LSN, windows: list[WindowStats]) -> None:
        """The windows of ``[start, end)``, after the run's own (``repair.go_on``)."""
        self.committer.run_end = end
        self._read_span(start, end, windows)

    def _read_span(self, start: LSN, end: LSN, windows: list[WindowStats]) -> None:
        """The windows of ``[start, end)``: asked for the stream, the stream and then peeks for
        what it left; else peeks, which with "auto" hand over to the stream when it pays."""
        if self.reader_used == "none":  # (the repair's rounds after a run with nothing to read)
            self.reader_used = "peek"
        if self.reader == "stream":
            start = self._streamed(start, end, windows)
        elif self.reader == "auto" and self.reader_note is None and self.follow is None:
            self.reader_note = self._stream_refusal()  # peeks whatever the slot's situation
        self.peeked(start, end, windows)

    def peeked(self, start: LSN, run_end: LSN, windows: list[WindowStats]) -> LSN:
        """The windows of ``[start, run_end)`` read by peeks, up to ``max_windows`` in all,
        appended to ``windows``; returns where they ended."""
        next_commit = False
        while (
            start < run_end
            and (self.max_windows is None or committed(windows) < self.max_windows)
            and not (self.follow is not None and self.follow.over())
        ):
            if self._failover:  # (a window's read waits for the standbys as it begins)
                standbys_streaming(self.source, self.slot, committed(windows))
            if self.columnar and not next_commit and not self.held:
                room = PEEK_WINDOWS
                if self.max_windows is not None:
                    room = min(room, self.max_windows - committed(windows))
                if self._stream_pays(start, run_end, windows):
                    start = self._streamed(start, run_end, windows)
                    continue
                done: list[WindowStats] = []
                declined = False
                try:
                    self._columnar_span(self._peek, start,
                                        min(run_end, start + self.max_window_bytes * room),
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
            stats = self._messages.window(start, end, next_commit=next_commit)
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

    def _stream_pays(self, start: LSN, run_end: LSN, windows: list[WindowStats]) -> bool:
        """With "auto", outside a following run, and once a run: whether the slot's situation
        now makes the stream the cheaper reader for what is left of the run: ``[start,
        run_end)``, or fewer windows when ``max_windows`` bounds it (``reader_choice``)."""
        if self.reader != "auto" or self.follow is not None or self._stream_tried:
            return False
        if self._stream_refusal() is not None:
            return False
        remaining = int(run_end) - int(start)
        if self.max_windows is not None:
            room = self.max_windows - committed(windows)
            remaining = min(remaining, self.max_window_bytes * room)
        restart = self.source.get_slot(self.slot).restart_lsn
        choice = peek_or_stream(pinned=int(start) - int(restart if restart is not None else start),
                                remaining=remaining,
                                span=self.max_window_bytes * PEEK_WINDOWS)  # fmt: skip
        if choice.reader == "peek":
            if self.reader_note is None:  # the first choice of the run is logged, not each
                log.info("slot %s: reading with peeks: %s", self.slot, choice.why)
                self.reader_note = choice.why
            return False
        log.info("slot %s: reading on with the stream from %s: %s", self.slot, start, choice.why)
        self.reader_note = choice.why
        self._stream_tried = True
        return True

    def published_before(self, end: LSN) -> bool:
        """Whether the slot holds a published change before ``end`` (a peek of one)."""
        return published_before(self.source, self.slot, self.options, end)

    def _streamed(self, start: LSN, run_end: LSN, windows: list[WindowStats]) -> LSN:
        """Drain what the stream can (``stream_phase``) from ``start``: the windows of
        ``[start, run_end)``, up to ``max_windows``, appended to ``windows``; returns where the
        peek goes on (``run_end`` when the stream took all of it)."""
        self.stream_opened = False
        refusal = self._stream_refusal()
        if refusal is not None:
            if self.reader == "stream":
                raise ValueError(f"reader='stream' cannot be used here: {refusal}. Fix: "
                                 f"reader='auto' (or 'peek')")  # fmt: skip
            self.reader_note = refusal
            return start
        span_end = run_end
        if self.max_windows is not None and self.follow is None:  # (peeks may have come first)
            room = self.max_windows - committed(windows)
            span_end = min(run_end, LSN(int(start) + self.max_window_bytes * room))
        phase = StreamPhase(source=self.source, lake=self.lake, slot=self.slot,
                            options=self.options, reader=self.reader, follow=self.follow,
                            drain_span=self._columnar_span)  # fmt: skip
        part = phase.read(start, run_end, span_end)
        self.stream_opened = part.opened
        if part.opened:
            self.reader_used = "stream"
        if part.note is not None:
            self.reader_note = part.note
        windows.extend(part.windows)
        if part.slot_free is False and self._peeks_on(part.position, run_end, windows):
            # A walsender still holding the slot: the peek would fail on it (slot active), or
            # read beside it. The run fails as retryable; what it committed is kept.
            raise SlotStreamError(self.slot, "the source", f"its stream ended ({part.note}) "
                                  f"and its walsender could not be seen to let go of the "
                                  f"slot, so the run cannot peek it now")  # fmt: skip
        return part.position

    def _peeks_on(self, position: LSN, run_end: LSN, windows: list[WindowStats]) -> bool:
        """Whether the run goes on with peeks from ``position``."""
        if self.follow is not None:
            return not self.follow.over()
        return position < run_end and (
            self.max_windows is None or committed(windows) < self.max_windows
        )

    def _stream_refusal(self) -> str | None:
        """Why this run cannot stream (None: it can)."""
        if self.reader == "peek":
            return "reader='peek' was asked for"
        if not self.columnar:
            return "the per-message decoder was asked for (columnar off), which reads peeks"
        if self.held:
            return "tables in quarantine are drained through the per-message decoder"
        return None

    def _following(self, start: LSN, windows: list[WindowStats], follow: Follow) -> None:
        """A following run: the stream, kept open until ``follow.over``; where the stream
        cannot be used, or once it ended or declined a window, passes of the peek every
        ``follow.window_s`` (each drains up to the WAL position it found), and a stream that
        had opened is opened again after ``follow.reopen_s`` (a run of days outlives a dropped
        connection). A stream refused (a role without REPLICATION) is not asked for again."""
        follow.cpu_at_start = cpu_s()
        self.committer.after_commit = follow.after(self.committer.after_commit)
        streams = self.reader != "peek"
        reopen_s, reopen_at = follow.reopen_s, 0.0
        if streams:
            start = self._streamed(start, LSN(NO_END), windows)
            streams = self.stream_opened
            reopen_at = time.monotonic() + reopen_s
        while not self._following_ends(follow):
            began = time.monotonic()
            if streams and began >= reopen_at and self._stream_refusal() is None:
                log.info("slot %s: opening its stream again from %s", self.slot, start)
                start = self._streamed(start, LSN(NO_END), windows)
                fold_older(windows)
                if not self.stream_opened:  # refused now: peeks for the rest of the run
                    streams = False
                    continue
                follow.reopens += 1
                # a stream that lasted less than the wait before it: wait twice as long
                lasted = time.monotonic() - began
                reopen_s = (
                    follow.reopen_s if lasted >= reopen_s else min(2 * reopen_s, REOPEN_MAX_S)
                )
                reopen_at = time.monotonic() + reopen_s
                continue
            run_end = self.committer.run_end = max(self.run_end, self.source.flush_lsn())
            if start < run_end and (
                run_end - start >= self.max_window_bytes or self.published_before(run_end)
            ):  # (a pass through unpublished WAL alone would commit an empty window each time)
                count = committed(windows)
                start = self.peeked(start, run_end, windows)
                follow.windows += committed(windows) - count
                fold_older(windows)
            follow.merge_if_due()
            follow.wait(began + follow.window_s)
        self._following_ends(follow)
        follow.merge_now()  # what the last windows brought, counted in the state's freshness

    def _following_ends(self, follow: Follow) -> bool:
        """``follow.over``, or a table put in quarantine when that ends the run."""
        if follow.stop_on_quarantine and self.held and follow.stopped_by is None:
            follow.stopped_by = "quarantine"
        return follow.over()

    def _columnar_span(self, reader: SlotReader, start: LSN, span_end: LSN,
                       done: list[WindowStats]) -> None:  # fmt: skip
        """The windows of ``[start, span_end)`` from ``reader``, on the columnar path; each is
        appended to ``done`` once committed (and the slot moved past it by the reader).

        Every peek has the server decode from the slot's ``restart_lsn``, which moves only at
        the server's running-transactions records (every 15 s under load), so one peek per
        window can decode the same WAL again and again. One peek serves several windows: they
        are cut at the same LSNs separate peeks would have ended at (a window holds the
        transactions whose commit record starts before its end), except that a window is never
        committed empty in the middle of a span: it grows to the next boundary instead.

        The window's stages overlap (``overlap``): the fetch runs ahead in a thread, the writes
        behind in another, the decoder in this one.
        """
        windows = ColumnarWindows(self.committer, start=start, span_end=span_end,
                                  window_bytes=self.max_window_bytes, options=reader.options,
                                  exact_end=reader.exact_end, follow=reader.follow)  # fmt: skip
        with self.committer.confirming(reader.confirm):
            windows.run(reader.batches(start, span_end), done)


def _incomplete(gaps: Mapping[str, Gap], unrepaired: Mapping[str, str]) -> dict[str, Any]:
    """The summary's ``incomplete``: each gap, and why the run's re-snapshot did not repair
    it when it tried (``repair``)."""
    shown: dict[str, Any] = {}
    for table, gap in gaps.items():
        shown[table] = gap.to_dict()
        if table in unrepaired:
            shown[table]["repair"] = unrepaired[table]
    return shown


def _preload() -> None:
    """Load the columnar path's libraries with the start-up, not inside the first window (whose
    time is the drain's rate). One that is missing is reported by the window that needs it."""
    import importlib

    for name in ("numpy", "pyarrow.compute", "pyarrow.parquet", "adbc_driver_postgresql.dbapi"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
