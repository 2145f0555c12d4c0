"""What the upkeep reports of a lake and each of its tables (for XCom and the task log), and
which tables it leaves alone for a run.

The task log gets a line per table that the upkeep changed or has advice for; a table that
needed nothing is a DEBUG line (a line per table per run was 80 lines of "skipped" for a lake
of 40 tables). A table with no commit since its last upkeep rests (``rested``): its log is not
read at all, which on an object store is most of a run's requests.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_pglogrepl.lake.seen_versions import SeenVersions


@dataclass
class TableReport:
    """What the upkeep found and did on one table."""

    table: str
    version_before: int
    version_after: int = 0
    files_before: int = 0
    files_after: int = 0
    small_files_before: int = 0
    dv_files_before: int = 0
    dv_files_after: int = 0
    compacted: bool = False
    keep_version: int | None = None
    retention_hours: int | None = None
    files_removed: int = 0
    bytes_removed: int = 0
    checkpoint: int | None = None
    log_cleaned: bool = False
    lsn: int | None = None  # the app's transaction version the table was left at
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class UpkeepReport:
    """The upkeep of one lake root: one ``TableReport`` per table (for XCom and logs)."""

    root: str
    slot: str
    keep: dict[str, Any]
    tables: list[TableReport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "slot": self.slot,
            "keep": self.keep,
            "tables": [asdict(t) for t in self.tables],
            "compacted": sum(t.compacted for t in self.tables),
            "files_removed": sum(t.files_removed for t in self.tables),
            "bytes_removed": sum(t.bytes_removed for t in self.tables),
        }


def rested(seen: SeenVersions, names: list[str], now: float,
           recheck_hours: float) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The tables the upkeep leaves alone this run, with what it noted of them: those with no
    commit since the upkeep last maintained them, less than ``recheck_hours`` ago, when the
    kept position then held none of their versions back. Every threshold of compaction and
    checkpointing is a count of files or versions, which only a commit changes; what time alone
    brings (files removed long enough ago to be vacuumed, log entries old enough to be cleaned,
    a checkpoint to renew) waits at most ``recheck_hours``. Resting never removes anything: at
    worst it delays what a run would have reclaimed."""
    noted = {name: seen.noted(name) for name in names}
    fresh = now - recheck_hours * 3600
    candidates = [name for name, entry in noted.items()
                  if entry is not None and entry.get("kept_all") is True
                  and fresh < float(entry.get("upkeep_at", 0)) <= now]  # fmt: skip
    still = seen.still(candidates)
    return {name: entry for name, entry in noted.items() if entry is not None
            and name in candidates and still[name]}  # fmt: skip


def rest(name: str, entry: dict[str, Any]) -> TableReport:
    """The report of a table the upkeep left alone (``_rested``)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(entry["upkeep_at"])))
    version = int(entry["version"])
    return TableReport(name, version_before=version, version_after=version,
                       skipped=[f"{_UNCHANGED}{since} (version {version})"])  # fmt: skip


# the skips every run of a table with nothing to do says; any other skip (a cleanup refused with
# what to set, deletion vectors to purge with Spark, a VACUUM that could not run) is advice
_UNCHANGED = "upkeep: no commit since the last upkeep at "
_ROUTINE_SKIPS = (
    _UNCHANGED,
    "compaction: below every threshold",
    "vacuum: no file removed more than ",
    "checkpoint: ",
    "log cleanup: no checkpoint",
    "log cleanup: no log entry older than ",
)


def upkeep_level(report: TableReport) -> int:
    """The level of a table's line: INFO when the upkeep changed it or has something to say
    (advice, a note), DEBUG when it needed nothing."""
    advice = report.notes or any(not s.startswith(_ROUTINE_SKIPS) for s in report.skipped)
    return logging.INFO if advice or _changed(report) else logging.DEBUG


def _changed(report: TableReport) -> bool:
    """Whether the upkeep committed or removed anything on the table."""
    if report.skipped and report.skipped[0].startswith(_UNCHANGED):
        return False
    checkpointed = not any(skip.startswith("checkpoint") for skip in report.skipped)
    return bool(report.compacted or report.files_removed or report.log_cleaned or checkpointed
                or report.version_after != report.version_before)  # fmt: skip


def summary(report: TableReport) -> str:
    parts = [f"files {report.files_before} -> {report.files_after}",
             f"versions {report.version_before} -> {report.version_after}"]  # fmt: skip
    if report.files_removed:
        parts.append(f"vacuumed {report.files_removed} files ({report.bytes_removed} bytes)")
    parts += report.notes + [f"skipped {s}" for s in report.skipped]
    return "; ".join(parts)
