"""What a drain run did, window by window: the records the loop fills and the JSON summary the
application prints last (which the operator reads into XCom), and the log line of each window."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_pglogrepl.lsn import LSN

__all__ = [
    "FOLD_AT",
    "READERS",
    "DrainResult",
    "WindowStats",
    "committed",
    "cpu_s",
    "fold_older",
    "log_window",
    "peak_rss_mb",
]

# How a run may read its slot (``Drain``'s ``reader``): the stream, the peek, or chosen per run
# (``reader_choice``). A run's summary says which it used (``DrainResult.reader``).
READERS = ("auto", "stream", "peek")

log = logging.getLogger("airflow_pglogrepl.drain")


@dataclass
class WindowStats:
    """One committed window."""

    start: LSN
    end: LSN
    transactions: int = 0
    changes: int = 0
    seconds: float = 0.0
    tables: dict[str, int] = field(default_factory=dict)
    decoder: str = "reference"  # or "columnar": which path decoded the window
    quarantined: dict[str, int] = field(default_factory=dict)  # held tables' changes
    count: int = 1  # the windows this record stands for (``fold``: a following run's older)


@dataclass
class DrainResult:
    """What a run did; ``to_dict`` is the JSON line the application prints last."""

    slot: str
    windows: list[WindowStats]
    confirmed_before: LSN | None
    confirmed_after: LSN | None
    run_end: LSN
    startup_s: float
    lag_bytes_left: int
    # tables in the lake's quarantine after the run (``lake.quarantine``): table -> its cause
    quarantined: dict[str, dict[str, str]] = field(default_factory=dict)
    # table -> {source name: lake name}: columns first stored this run under another name
    # (``lake.column_names``: Delta would take them for another column's)
    stored_as: dict[str, dict[str, str]] = field(default_factory=dict)
    # how the slot was read: "stream" (START_REPLICATION), "peek", or "none" (nothing to read),
    # and why it was not streamed
    reader: str = "peek"
    reader_note: str | None = None
    follow: dict[str, Any] | None = None  # a following run's ``Follow.to_dict``
    # relations whose state the WAL could not keep equal to the source (``pipeline.coverage``):
    # table -> reason, what, fix, since
    incomplete: dict[str, dict[str, str]] = field(default_factory=dict)
    # online backfills in progress or done in the run (``spark.backfill``): table -> progress
    backfills: dict[str, dict[str, Any]] = field(default_factory=dict)
    # parity checks that ended in the run (``spark.state_parity``): table -> what was found
    parity: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        changes = sum(w.changes for w in self.windows)
        window_s = sum(w.seconds for w in self.windows)
        first = self.windows[0].start if self.windows else self.confirmed_after
        last = self.windows[-1].end if self.windows else self.confirmed_after
        return {
            "slot": self.slot,
            "windows": committed(self.windows),
            "window_start_lsn": str(first) if first else None,
            "window_end_lsn": str(last) if last else None,
            "confirmed_flush_lsn_before": str(self.confirmed_before)
            if self.confirmed_before
            else None,
            "confirmed_flush_lsn_after": str(self.confirmed_after)
            if self.confirmed_after
            else None,
            "transactions": sum(w.transactions for w in self.windows),
            "changes": changes,
            "wal_bytes": (last - first) if first and last else 0,
            "lag_bytes_left": self.lag_bytes_left,
            "startup_s": round(self.startup_s, 3),
            "changes_per_s": round(changes / window_s, 1) if window_s > 0 else 0.0,
            "tables": _sum_tables(self.windows),
            "columnar_windows": sum(w.count for w in self.windows if w.decoder == "columnar"),
            "reader": self.reader,
            "reader_note": self.reader_note,
            "peak_rss_mb": peak_rss_mb(),
            "cpu_s": cpu_s(),
            "follow": self.follow,
            "columns_stored_as": self.stored_as,
            "quarantined": {
                table: {**cause, "changes": sum(w.quarantined.get(table, 0) for w in self.windows)}
                for table, cause in self.quarantined.items()
            },
            "incomplete": self.incomplete,
            "backfills": self.backfills,
            "parity": self.parity,
        }


def committed(windows: Sequence[WindowStats]) -> int:
    """How many windows ``windows`` stand for (folded records count for all of theirs)."""
    return sum(w.count for w in windows)


# A following run keeps this many window records at most: older ones are folded into one, so a
# run of days holds a few hundred kilobytes for its summary, not a record per window.
FOLD_AT = 1000


def fold_older(windows: list[WindowStats]) -> None:
    """Past ``FOLD_AT`` records, fold all but the last into one (in place): its bounds are
    theirs, its counts their sums. The last stays whole: where the run goes on from."""
    if len(windows) <= FOLD_AT:
        return
    older = windows[:-1]
    decoders = {w.decoder for w in older}
    folded = WindowStats(
        start=older[0].start, end=older[-1].end,
        transactions=sum(w.transactions for w in older), changes=sum(w.changes for w in older),
        seconds=sum(w.seconds for w in older), tables=_sum_tables(older),
        decoder=decoders.pop() if len(decoders) == 1 else "mixed",
        quarantined=_sum_quarantined(older), count=committed(older),
    )  # fmt: skip
    windows[:-1] = [folded]


def _sum_quarantined(windows: Sequence[WindowStats]) -> dict[str, int]:
    total: dict[str, int] = {}
    for window in windows:
        for name, count in window.quarantined.items():
            total[name] = total.get(name, 0) + count
    return total


def cpu_s() -> float:
    """This process's CPU time so far, user and system, all threads (what a change costs)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round(usage.ru_utime + usage.ru_stime, 3)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports ``ru_maxrss`` in KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _sum_tables(windows: Sequence[WindowStats]) -> dict[str, int]:
    total: dict[str, int] = {}
    for window in windows:
        for name, count in window.tables.items():
            total[name] = total.get(name, 0) + count
    return total


def log_window(stats: WindowStats, run_end: LSN) -> None:
    log.info(
        "window %s..%s (%s): %d transactions, %d changes, %d WAL bytes, %.2fs, lag left %d",
        stats.start, stats.end, stats.decoder, stats.transactions, stats.changes,
        stats.end - stats.start, stats.seconds, run_end - stats.end,
    )  # fmt: skip
