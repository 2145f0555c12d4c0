"""Reading the slot through the stream (``hooks.pg.slot_stream``) for the drain loop: when a run
may stream, the windows it drains so, and how its end hands over to the peek.

One stream decodes each WAL record once, where every peek decodes again from the slot's
``restart_lsn``. Each window is confirmed to the server as the slot's flushed position once the
lake committed it, as the peek path advances the slot then. A run streams from its start; what
the stream declines (a type the columnar decoder does not take, a table's error) is peeked from
where the stream's last window ended, and so, with ``reader="auto"``, is what is left when the
stream ends early (``SlotStreamError``: its walsender terminated, the connection lost): a run
that can go on reading the slot does, instead of failing for a retry that may meet the same
end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columnar import ColumnarUnsupportedError
from airflow_pglogrepl.exceptions import PgLogReplError, SlotStreamError, SlotStreamUnavailableError
from airflow_pglogrepl.lake.quarantine import TABLE_ERRORS
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.results import WindowStats

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.pg.slot_stream import SlotStream
    from airflow_pglogrepl.pipeline.drain import Drain
    from airflow_pglogrepl.pipeline.follow import Follow

__all__ = ["confirm_after_stream", "stream_options", "stream_refusal", "streamed"]

log = logging.getLogger("airflow_pglogrepl.drain")


def streamed(drain: Drain, start: LSN, run_end: LSN, windows: list[WindowStats]) -> LSN:
    """Drain what the stream can (``hooks.pg.slot_stream``) from ``start``: the windows of
    ``[start, run_end)``, up to ``max_windows``, appended to ``windows``; returns where the
    peek goes on (``run_end`` when the stream took all of it).

    One stream decodes each WAL record once, where every peek decodes again from the
    slot's ``restart_lsn``. A window is confirmed to the server as the slot's flushed
    position once committed, as the peek path advances the slot then.

    A stream that ends early (``SlotStreamError``) hands over to the peek with
    ``reader="auto"``, and is raised with ``reader="stream"``. Either way the hand-over needs
    the slot confirmed where the stream's last window ended: the peek reads from the slot's
    position, and from an older one would store what lies between twice.
    """
    refusal = stream_refusal(drain)
    if refusal is not None:
        if drain.reader == "stream":
            raise ValueError(f"reader='stream' cannot be used here: {refusal}. Fix: "
                             f"reader='auto' (or 'peek')")  # fmt: skip
        drain.reader_note = refusal
        return start
    span_end = run_end
    if drain.max_windows is not None and drain.follow is None:
        span_end = min(run_end, LSN(int(start) + drain.max_window_bytes * drain.max_windows))
    try:
        stream = drain.source.stream_slot(
            drain.slot, start=start, options=stream_options(drain.options),
            alive=drain.lake.check_writer,
        )  # fmt: skip
    except SlotStreamUnavailableError as exc:
        if drain.reader == "stream":
            raise
        drain.reader_note = f"the stream was refused, so the slot was peeked: {exc.reason}"
        log.warning("slot %s: %s", drain.slot, drain.reader_note)
        return start
    drain.reader_used = "stream"
    done: list[WindowStats] = []
    confirmed = True
    ended: SlotStreamError | None = None  # how the stream ended early (reader="auto")
    try:
        drain._stream = stream
        batches = (
            _until(stream, span_end) if drain.follow is None else _ticking(stream, drain.follow)
        )
        drain._columnar_span(start, span_end, done, batches, exact_end=True,
                             options=getattr(stream, "options", drain.options))  # fmt: skip
    except (ColumnarUnsupportedError, *TABLE_ERRORS) as exc:
        drain.reader_note = (f"from {done[-1].end if done else start} the windows were "
                            f"peeked and decoded per message ({exc})")  # fmt: skip
        log.info("slot %s: %s", drain.slot, drain.reader_note)
    except SlotStreamError as exc:
        if drain.reader == "stream":
            raise
        ended = exc
    finally:
        drain._stream = None
        # the last confirm reaches the server; the slot is free again
        if not stream.close() and done:
            confirmed = confirm_after_stream(drain, done[-1].end)
    windows.extend(done)
    position = done[-1].end if done else start
    if not confirmed and position < run_end and not (drain.follow and drain.follow.over()):
        # The peek reads from the slot's position, which is behind the lake's: what lies
        # between would be stored twice. The next run's reconcile moves the slot first.
        why = f" ({ended.reason})" if ended is not None else ""
        raise SlotStreamError(drain.slot, "the source", f"it ended{why} before the slot could "
                              f"be confirmed at {position}, the lake's "
                              f"position") from ended  # fmt: skip
    if ended is not None:
        drain.reader_note = (f"the stream ended early ({ended.reason}); from {position} the "
                             f"slot was peeked")  # fmt: skip
        log.warning("slot %s: the replication stream ended early at %s, after %d window(s) "
                    "(%s). This run goes on reading the slot with peeks (reader='auto') from "
                    "there, where the lake and the slot agree: nothing is lost or stored "
                    "twice, but every peek decodes again from the slot's restart_lsn, so the "
                    "run is slower. If it happens on every run, the server's log says why the "
                    "walsender ended", drain.slot, position, len(done),
                    ended.reason)  # fmt: skip
    return position


def stream_options(options: dict[str, str]) -> dict[str, str]:
    """pgoutput's options for the stream: protocol 2 with ``streaming 'on'``, so a transaction
    bigger than the server's ``logical_decoding_work_mem`` is sent while it runs (and waits in
    the lake, ``lake.in_progress``) instead of in the server's spill files until its commit.
    ``SlotStream`` takes protocol 1 back on a server older than 14."""
    return {**options, "proto_version": "2", "streaming": "on"}


def confirm_after_stream(drain: Drain, end: LSN) -> bool:
    """The stream ended on its own (its walsender terminated) after the windows up to
    ``end`` were committed, so their confirm may not have reached the server: advance the
    slot there the peek path's way. False: that failed too (the next run's reconcile does
    it: the lake ahead of the slot)."""
    try:
        slot = drain.source.get_slot(drain.slot)
        if slot.confirmed_flush_lsn is None or slot.confirmed_flush_lsn < end:
            drain.lake.check_writer()
            drain.source.advance_slot(drain.slot, end)
        return True
    except PgLogReplError as exc:
        log.warning("slot %s: its stream ended before the confirm of %s could be seen, and "
                    "advancing it failed (%s: %s); the next run advances it to the lake",
                    drain.slot, end, type(exc).__name__, exc)  # fmt: skip
        return False


def stream_refusal(drain: Drain) -> str | None:
    """Why this run cannot stream (None: it can)."""
    if drain.reader == "peek":
        return "reader='peek' was asked for"
    if not drain.columnar:
        return "the per-message decoder was asked for (columnar off), which reads peeks"
    if drain.held:
        return "tables in quarantine are drained through the per-message decoder"
    return None


def _ticking(stream: SlotStream, follow: Follow) -> Iterator[tuple[Any, LSN | None]]:
    """The stream's messages a batch at a time, each with its WAL end (as ``_until``), and
    ``(None, None)`` whenever nothing came for ``follow.tick_s``: a following run's clock."""
    for batch in stream.batches_or_idle(follow.tick_s()):
        yield (None, None) if batch is None else (batch.messages, batch.wal_end)


def _until(stream: SlotStream, end: LSN) -> Iterator[tuple[Any, LSN]]:
    """The stream's messages a batch at a time, each with the WAL position before which every
    transaction has been sent, until that reaches ``end`` (transactions are sent in commit
    order, each as its commit is decoded)."""
    for batch in stream.batches():
        yield batch.messages, batch.wal_end
        if batch.wal_end >= end:
            return
