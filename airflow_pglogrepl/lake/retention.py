"""How long a table's removed files and log entries must stay: the retention rule of the upkeep.

``lake.upkeep`` deletes two kinds of things: data files the log removed (VACUUM) and old log
entries (log cleanup). Either can take away a version a reader or a replay still needs. This
module says which versions must stay readable (``Keep``), which version holds them
(``kept_versions``), how long removed files must therefore be kept (``retention_hours``), and
which versions a log can still read once entries are gone (``LogListing.readable_from``); the
upkeep deletes nothing that this does not allow.

The retention rule. A file the log removed at version r is needed by versions before r only. If
version K holds the kept position (its newest version whose app transaction is at or below the
kept LSN, as ``lake.cut`` reads it; or, for kept hours, the version current that many hours
ago), every file a version >= K needs was removed after K was committed. A retention of "the
age of K, plus a margin for writers' clocks" therefore keeps them all. The retention is never
below a floor that protects running readers: ``min_retention_hours`` (default Delta's 7 days)
or the table's own ``delta.deletedFileRetentionDuration`` when longer. A kept-hours shorter than
that floor is refused (``UnsafeRetentionError``, ``retention_floor``), before anything is done;
a kept LSN younger than it is simply kept longer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.exceptions import LakeError, UnsafeRetentionError
from airflow_pglogrepl.lake.storage import filesystem
from airflow_pglogrepl.lake.txnlog import HistoryExpiredError, TxnLog
from airflow_pglogrepl.lsn import LSN

# Writers stamp removals with their own clocks and storage stamps log files with its: an hour
# more than the computed age absorbs any skew between them.
MARGIN_HOURS = 1.0
# Delta's defaults when a table does not set them (delta-rs and Spark agree).
DELETED_FILE_RETENTION_HOURS = 7 * 24.0
LOG_RETENTION_HOURS = 30 * 24.0
_COMMIT = re.compile(r"(\d{20})\.json")
# classic, multi-part and V2 checkpoints (as ``lake.txnlog`` lists them)
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint\..+")
_INTERVAL = re.compile(r"\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*", re.IGNORECASE)
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}


@dataclass(frozen=True)
class Keep:
    """What VACUUM and log cleanup must leave readable: every version from the one holding
    ``lsn`` (an LSN of the lake's drain), and every version of the last ``hours``; never fewer
    than ``min_retention_hours`` of removed files (a running reader's snapshot)."""

    lsn: LSN | None = None
    hours: float | None = 7 * 24.0
    min_retention_hours: float = 7 * 24.0


@dataclass(frozen=True)
class LogListing:
    """One listing of a table's ``_delta_log``: modification times (epoch seconds) of its
    commit files and checkpoints by version."""

    commits: dict[int, float]
    checkpoints: dict[int, float]

    @property
    def newest(self) -> int:
        return max(self.commits)

    def readable_from(
        self, gone: set[int] | None = None, gone_checkpoints: set[int] | None = None
    ) -> int | None:
        """The oldest version that can be read (None: none), with the commit files of ``gone``
        and the checkpoints of ``gone_checkpoints`` deleted."""
        commits = set(self.commits) - (gone or set())
        checkpoints = set(self.checkpoints) - (gone_checkpoints or set())
        if not commits:
            return None
        newest = max(commits)
        missing = newest
        while missing in commits:
            missing -= 1
        if missing < 0:
            return 0
        usable = [c for c in checkpoints if missing <= c <= newest]
        return min(usable) if usable else None

    def time_of(self, version: int) -> float | None:
        return self.commits.get(version, self.checkpoints.get(version))


OWN_RETENTION = "delta.deletedFileRetentionDuration"


def retention_floor(name: str, own_text: str | None, keep: Keep) -> float:
    """The shortest retention the table allows, given its own ``OWN_RETENTION``; refuses a
    kept-hours below it."""
    own = interval_hours(own_text, None)
    floor = max(keep.min_retention_hours, own or 0.0)
    if keep.hours is not None and keep.hours < floor:
        why = (
            f"its delta.deletedFileRetentionDuration ({own:g} hours)"
            if own is not None and own > keep.min_retention_hours
            else f"min_retention_hours ({keep.min_retention_hours:g})"
        )
        raise UnsafeRetentionError(name, keep.hours, floor, why)
    return floor


def kept_versions(uri: str, app: str, keep: Keep, listing: LogListing, now: float,
                  notes: list[str]) -> tuple[int | None, int | None]:  # fmt: skip
    """The version holding the kept LSN, and the version current ``keep.hours`` ago (None: not
    asked). A table with no version at or below the LSN (created after it, or whose log no
    longer reaches it) is kept from its oldest readable version."""
    oldest = listing.readable_from()
    by_lsn = by_hours = None
    if keep.lsn is not None:
        try:
            found = TxnLog(uri, app).at_or_below(int(keep.lsn))
        except HistoryExpiredError:
            found = None
            notes.append(f"the log no longer reaches {keep.lsn}: kept from version {oldest}")
        by_lsn = found.version if found is not None else oldest
    if keep.hours is not None:
        then = now - keep.hours * 3600
        older = [v for v, stamp in listing.commits.items() if stamp <= then]
        by_hours = max(max(older), oldest or 0) if older else oldest
    return by_lsn, by_hours


def retention_hours(floor: float, keep: Keep, listing: LogListing, by_lsn: int | None,
                    now: float) -> float:  # fmt: skip
    """How long VACUUM must keep removed files (the retention rule): the floor, or the kept
    hours when longer, or the age of ``by_lsn`` (the version holding the kept LSN) plus
    ``MARGIN_HOURS`` when older; infinite when the log no longer dates that version."""
    retention = max(floor, keep.hours or 0.0)
    if by_lsn is not None:
        stamp = listing.time_of(by_lsn)
        retention = max(retention, math.inf if stamp is None else (now - stamp) / 3600)
        retention += MARGIN_HOURS
    return retention


def list_log(uri: str) -> LogListing:
    """The table's ``_delta_log`` as the storage lists it: which commit files and checkpoints
    exist, and when each was written (what dates a kept version, and the ages the simulated log
    cleanup goes by)."""
    from pyarrow import fs

    system, base = filesystem(uri)
    infos = system.get_file_info(fs.FileSelector(f"{base}/_delta_log", allow_not_found=True))
    commits: dict[int, float] = {}
    checkpoints: dict[int, float] = {}
    for info in infos:
        stamp = info.mtime.timestamp() if info.mtime is not None else 0.0
        if match := _COMMIT.fullmatch(info.base_name):
            commits[int(match.group(1))] = stamp
        elif match := _CHECKPOINT.fullmatch(info.base_name):
            version = int(match.group(1))
            checkpoints[version] = max(stamp, checkpoints.get(version, 0.0))
    if not commits:
        raise LakeError(f"{uri} has no Delta commit file: not a table the upkeep can maintain")
    return LogListing(commits, checkpoints)


def table_property(table: Any, key: str) -> str | None:
    """A property of an open table (None: the table does not set it, Delta's default holds)."""
    value = table.metadata().configuration.get(key)
    return None if value is None else str(value)


def interval_hours(text: str | None, default: float | None) -> float | None:
    """A Delta interval (``interval 7 days``, ``168 hours`` ...) in hours."""
    if text is None:
        return default
    match = _INTERVAL.fullmatch(text)
    unit = match.group(2).lower().rstrip("s") if match else ""
    if match is None or unit not in _UNIT_HOURS:
        raise LakeError(f"cannot read the Delta interval {text!r}: expected e.g. 'interval 7 days'")
    return float(match.group(1)) * _UNIT_HOURS[unit]
