"""The continuous mode (``--follow``): a run that keeps reading the slot and commits a window
every few seconds, until it is told to stop or reaches its bound, and what it measured.

A scheduled run drains up to the WAL position it found at its start and ends. A following run
keeps its stream open: each window is committed once it holds changes and ``window_s`` has
passed since the last commit, or once it holds ``max_window_bytes`` of WAL, whichever comes
first. Where it can only peek (``reader="peek"``, a role without ``REPLICATION``, tables in
quarantine), it drains in passes, one every ``window_s``.

Freshness is the time from a transaction's commit on the source to the moment its rows are
readable in ``changes/`` (the window's commit returned). It is measured across two clocks, the
source's (``_commit_ts``) and this host's: their offset is in every figure.

The current rows (``state/``, and the histories the run keeps) are merged while it follows, not
only when it ends: after a window's commit, once ``merge_s`` seconds passed since the last merge
(``merge``, the application's; small batches merge without a JVM), and while nothing comes,
once ``merge_s`` passed since the merge before the last window. Their freshness is measured
the same way, from commit to the merge that made the rows readable in ``state/``
(``state_freshness``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NO_END", "STOPPED_BY", "Follow", "Freshness", "freshness_of"]

# why a following run ended: a signal (SIGTERM from Airflow's kill, SIGINT from a terminal),
# its time bound, its window bound, a table put in the lake's quarantine
STOPPED_BY = ("signal", "time", "windows", "quarantine")

NO_END = (1 << 64) - 1  # a following stream's span: it ends when told, not at an LSN
_WAKE_S = 0.05  # how often a waiting run looks at its stop flag
# A following run whose stream ended (a dropped connection, a walsender restarted, a window its
# decoder declined) drains with peeks, which decode again from restart_lsn on every pass: it
# tries the stream again after REOPEN_S, backing off to REOPEN_MAX_S while streams keep ending.
REOPEN_S = 30.0
REOPEN_MAX_S = 600.0
_BUCKET_S = 0.01  # the freshness histogram's resolution
_BUCKETS = 60_000  # 10 ms buckets up to 10 minutes; anything later falls in the last

log = logging.getLogger("airflow_pglogrepl.drain")


class Freshness:
    """Seconds from commit to readable, per transaction, as a histogram: memory stays the same
    through a run of days at thousands of transactions a second."""

    def __init__(self) -> None:
        import numpy as np

        self._counts = np.zeros(_BUCKETS, dtype=np.int64)
        self.worst = 0.0
        self.transactions = 0

    def add(self, seconds: Any) -> None:
        """Count transactions readable ``seconds`` (a NumPy array) after their commit."""
        import numpy as np

        if not len(seconds):
            return
        buckets = np.clip((np.maximum(seconds, 0.0) / _BUCKET_S).astype(np.int64), 0,
                          _BUCKETS - 1)  # fmt: skip
        self._counts += np.bincount(buckets, minlength=_BUCKETS)
        self.worst = max(self.worst, float(seconds.max()))
        self.transactions += len(seconds)

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100) in seconds, to the histogram's 10 ms; None without
        a transaction."""
        import numpy as np

        if not self.transactions:
            return None
        rank = max(1, int(np.ceil(q / 100.0 * self.transactions)))
        bucket = int(np.searchsorted(np.cumsum(self._counts), rank))
        return round((bucket + 1) * _BUCKET_S, 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "p50_s": self.percentile(50),
            "p99_s": self.percentile(99),
            "max_s": round(self.worst, 3) if self.transactions else None,
        }


@dataclass
class Follow:
    """A following run's bounds and its stop switch (``request_stop``, safe in a signal
    handler: it only sets a flag, where a lock taken there could be held by the very code the
    signal interrupted).

    ``window_s``: seconds between window commits while changes come; ``seconds``: end the run
    after this long (None: until stopped); ``max_windows``: end it after this many windows;
    ``stop_on_quarantine``: end it once a table goes to the lake's quarantine (the run then
    fails naming it, instead of following on without it).
    """

    window_s: float
    seconds: float | None = None
    max_windows: int | None = None
    stop_on_quarantine: bool = False
    stop_requested: bool = False
    began: float = field(default_factory=time.monotonic)
    freshness: Freshness = field(default_factory=Freshness)
    stopped_by: str | None = None
    windows: int = 0  # committed so far
    cpu_at_start: float | None = None  # this process's CPU seconds when the following began
    # after its stream ended, the run peeks and opens the stream again this long after (then
    # twice as long each time a stream ends before it has lasted that long, up to REOPEN_MAX_S)
    reopen_s: float = REOPEN_S
    reopens: int = 0  # streams opened again after one ended (refused attempts not counted)
    # merges of state/ (and history/) while following: ``merge`` (None: only at the run's end)
    # after a window's commit, once ``merge_s`` passed since the last one
    merge: Callable[[], Any] | None = None
    merge_s: float = 30.0
    merges: int = 0
    state_freshness: Freshness = field(default_factory=Freshness)
    _unmerged: list[Any] = field(default_factory=list)  # commit times not in state/ yet
    _merged_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"the follow window must be a positive number of seconds, got "
                             f"{self.window_s!r}")  # fmt: skip
        if not self.reopen_s > 0:
            raise ValueError(f"the wait before a stream is opened again must be a positive "
                             f"number of seconds, got {self.reopen_s!r}")  # fmt: skip
        if not self.merge_s > 0:
            raise ValueError(f"the seconds between merges while following must be positive, "
                             f"got {self.merge_s!r}")  # fmt: skip
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"a follow bound must be a positive number of seconds, got "
                             f"{self.seconds!r}")  # fmt: skip

    def over(self) -> bool:
        """Whether the run ends now; records why."""
        if self.stopped_by is None:
            if self.stop_requested:
                self.stopped_by = "signal"
            elif self.seconds is not None and time.monotonic() - self.began >= self.seconds:
                self.stopped_by = "time"
            elif self.max_windows is not None and self.windows >= self.max_windows:
                self.stopped_by = "windows"
        return self.stopped_by is not None

    def committed(self, commit_times: Any, readable_at: float) -> None:
        """A window's transactions (their commit times) became readable in ``changes/``: their
        freshness, and they wait for the next merge."""
        self.windows += 1
        self.freshness.add(freshness_of(commit_times, readable_at))
        if self.merge is not None and len(commit_times):
            self._unmerged.append(commit_times)

    def after(self, step: Callable[[Any], None] | None) -> Callable[[Any], None]:
        """What follows each window's commit: ``step`` (the repair's), then ``after_window``."""

        def after_commit(end: Any) -> None:
            if step is not None:
                step(end)
            self.after_window()

        return after_commit

    def after_window(self) -> None:
        """After a window's commit: merge the states (and histories) when ``merge_s`` passed
        since the last merge; the transactions it made readable in ``state/`` are counted in
        ``state_freshness``."""
        if self.merge is None or time.monotonic() - self._merged_at < self.merge_s:
            return
        self.merge_now()

    def merge_if_due(self) -> None:
        """While nothing comes: merge what committed windows brought once ``merge_s`` passed
        since the last merge. A burst's last window may commit just after a merge, and no window
        after it comes to merge it (``after_window``) until the source writes again."""
        if self._unmerged and time.monotonic() - self._merged_at >= self.merge_s:
            self.merge_now()

    def merge_now(self) -> None:
        """Merge now (the run's end merges once more, after the following)."""
        import numpy as np

        if self.merge is None:
            return
        waiting, self._unmerged = self._unmerged, []
        began = time.monotonic()
        self.merge()
        self._merged_at = time.monotonic()
        self.merges += 1
        if waiting:
            self.state_freshness.add(freshness_of(np.concatenate(waiting), time.time()))
        log.info("states merged while following (%d transactions, %.2f s)",
                 sum(len(w) for w in waiting), self._merged_at - began)  # fmt: skip

    def request_stop(self) -> None:
        """End the run after the window in hand (a signal's handler calls this)."""
        self.stop_requested = True

    def tick_s(self) -> float:
        """How long a following reader waits for data before it looks at the clock."""
        return min(0.25, self.window_s / 4)

    def wait(self, until: float) -> None:
        """Sleep until the monotonic time ``until``, the run's time bound, or a stop."""
        if self.seconds is not None:
            until = min(until, self.began + self.seconds)
        while not self.stop_requested and (left := until - time.monotonic()) > 0:
            time.sleep(min(left, _WAKE_S))

    def to_dict(self) -> dict[str, Any]:
        """The summary's ``follow``: its settings, how long it ran and why it ended, and the
        freshness of what it committed."""
        from airflow_pglogrepl.pipeline.results import cpu_s

        return {
            "window_s": self.window_s,
            "seconds": round(time.monotonic() - self.began, 3),
            # CPU of this process (all its threads) while it followed: the cost of the changes
            "cpu_s": round(cpu_s() - self.cpu_at_start, 3) if self.cpu_at_start else None,
            "stopped_by": self.stopped_by,
            "stream_reopens": self.reopens,
            "freshness": self.freshness.to_dict(),
            # from commit to readable in state/ (merged while following; None: only at the end)
            "merge_s": self.merge_s if self.merge is not None else None,
            "merges": self.merges,
            "state_freshness": self.state_freshness.to_dict(),
        }


def freshness_of(commit_ts: Any, readable_at: float) -> Any:
    """Seconds from each commit time (``_commit_ts`` values, as a NumPy ``datetime64``
    array) to ``readable_at`` (``time.time()``)."""
    import numpy as np

    micros = commit_ts.astype("datetime64[us]").astype(np.int64)
    return readable_at - micros / 1e6
