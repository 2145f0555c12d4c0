"""The part of a run that reads its slot through the replication stream, and its hand-over to
the peek.

One stream decodes each WAL record once, where every peek decodes again from the slot's
``restart_lsn``. A run streams from its start; what the stream declines (a type the columnar
decoder does not take, a table's error) is peeked from where the stream's last window ended,
and so, with ``reader="auto"``, is what is left when the stream ends early
(``SlotStreamError``: its walsender terminated, the connection lost). A hand-over needs the
slot confirmed where the stream's last window ended: the peek reads from the slot's position,
and from an older one would store what lies between twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_pglogrepl.changelog.columnar import ColumnarUnsupportedError
from airflow_pglogrepl.exceptions import PgLogReplError, SlotStreamError, SlotStreamUnavailableError
from airflow_pglogrepl.lake.quarantine import TABLE_ERRORS
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.readers import SlotReader, StreamReader, stream_options
from airflow_pglogrepl.pipeline.results import WindowStats, committed

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.pipeline.follow import Follow
    from airflow_pglogrepl.pipeline.source import DrainSource

__all__ = ["StreamPhase", "StreamedPart"]

log = logging.getLogger("airflow_pglogrepl.drain")

# The columnar windows of a span read by a reader: (reader, start, span end, committed windows)
SpanDrainer = Callable[[SlotReader, LSN, LSN, list[WindowStats]], None]


@dataclass
class StreamedPart:
    """What the stream did: the windows it committed, where the peek goes on (``position``),
    whether it was opened, and why the rest is peeked (``note``, None: it took all)."""

    windows: list[WindowStats]
    position: LSN
    opened: bool
    note: str | None = None
    # whether the stream's walsender was seen to let go of the slot (None: not opened, or a
    # reader that cannot tell): a peek may follow only when it did
    slot_free: bool | None = None


class StreamPhase:
    """Reads ``slot`` through one stream from a run's start (``read``), the windows drained by
    ``drain_span``; ``reader`` is the run's choice ("auto", "stream"; "peek" never gets here)."""

    def __init__(self, *, source: DrainSource, lake: Lake, slot: str,
                 options: Mapping[str, str], reader: str, follow: Follow | None,
                 drain_span: SpanDrainer) -> None:  # fmt: skip
        self.source = source
        self.lake = lake
        self.slot = slot
        self.options = options
        self.reader = reader
        self.follow = follow
        self.drain_span = drain_span

    def read(self, start: LSN, run_end: LSN, span_end: LSN) -> StreamedPart:
        """The windows of ``[start, span_end)`` (a following run: until it is told to stop)."""
        try:
            stream = self.source.stream_slot(self.slot, start=start,
                                             options=stream_options(self.options),
                                             alive=self.lake.check_writer)  # fmt: skip
        except SlotStreamUnavailableError as exc:
            if self.reader == "stream":
                raise
            note = f"the stream was refused, so the slot was peeked: {exc.reason}"
            log.warning("slot %s: %s", self.slot, note)
            return StreamedPart([], start, opened=False, note=note)
        done: list[WindowStats] = []
        part = StreamedPart(done, start, opened=True)
        ended: SlotStreamError | None = None  # how the stream ended early (reader="auto")
        confirmed = True
        try:
            self.drain_span(StreamReader(stream, self.follow), start, span_end, done)
        except (ColumnarUnsupportedError, *TABLE_ERRORS) as exc:
            part.note = (f"from {done[-1].end if done else start} the windows were peeked "
                         f"and decoded per message ({exc})")  # fmt: skip
            log.info("slot %s: %s", self.slot, part.note)
        except SlotStreamError as exc:
            if self.reader == "stream":
                raise
            ended = exc
        finally:
            # the last confirm reaches the server; the slot is free again
            if not stream.close() and done:
                confirmed = self._confirm_after_stream(done[-1].end)
            part.slot_free = getattr(stream, "slot_free", None)
        part.position = done[-1].end if done else start
        following_over = self.follow is not None and self.follow.over()
        if not confirmed and part.position < run_end and not following_over:
            # The peek reads from the slot's position, which is behind the lake's: what lies
            # between would be stored twice. The next run's reconcile moves the slot first.
            why = f" ({ended.reason})" if ended is not None else ""
            raise SlotStreamError(self.slot, "the source", f"it ended{why} before the slot "
                                  f"could be confirmed at {part.position}, the lake's "
                                  f"position") from ended  # fmt: skip
        if ended is not None:
            self._hand_over(part, ended)
        return part

    def _hand_over(self, part: StreamedPart, ended: SlotStreamError) -> None:
        """The stream ended early: the peek goes on from ``part.position``, where the lake and
        the slot agree (once the slot is free of the stream's walsender: the drain's check)."""
        part.note = f"the stream ended early ({ended.reason}); from {part.position} the slot " \
                    f"was peeked"  # fmt: skip
        log.warning("slot %s: the replication stream ended early at %s, after %d window(s) "
                    "(%s). This run goes on reading the slot with peeks (reader='auto') from "
                    "there, where the lake and the slot agree: nothing is lost or stored "
                    "twice, but every peek decodes again from the slot's restart_lsn, so the "
                    "run is slower. If it happens on every run, the server's log says why the "
                    "walsender ended", self.slot, part.position, committed(part.windows),
                    ended.reason)  # fmt: skip

    def _confirm_after_stream(self, end: LSN) -> bool:
        """The stream ended on its own (its walsender terminated) after the windows up to
        ``end`` were committed, so their confirm may not have reached the server: advance the
        slot there the peek path's way. False: that failed too (the next run's reconcile does
        it: the lake ahead of the slot)."""
        try:
            slot = self.source.get_slot(self.slot)
            if slot.confirmed_flush_lsn is None or slot.confirmed_flush_lsn < end:
                self.lake.check_writer()
                self.source.advance_slot(self.slot, end)
            return True
        except PgLogReplError as exc:
            log.warning("slot %s: its stream ended before the confirm of %s could be seen, and "
                        "advancing it failed (%s: %s); the next run advances it to the lake",
                        self.slot, end, type(exc).__name__, exc)  # fmt: skip
            return False
