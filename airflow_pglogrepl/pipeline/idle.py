"""Whether a drain run has anything to do, decided on the Airflow worker without Spark: the
drain's own first question, asked before Spark starts (``SlotDrainOperator(skip_when_idle=...)``).

A drain run is idle when all of these hold, read in this order (each read is cheap) under the
lake's writer lock (another run writing the lake: not idle, and the peek below never holds the
slot while that run's drain needs it):

1. the lake is local (a path or ``file:`` URI: the worker reads its Delta logs with no storage
   credentials) and its position is the slot's ``confirmed_flush_lsn`` (an empty lake, a lake
   ahead of the slot after a lost advance, or one behind it is the application's to handle);
2. no committed change waits for its merge into ``state/`` (``pending_tables``; only when the
   run merges) or into a history the run keeps (``merge.history.histories_behind``), and no
   backfill is in progress (``lake.backfill``);
3. nothing the publications produce was committed after ``confirmed_flush_lsn``, and the WAL
   the slot holds (from its ``restart_lsn``, where every peek decodes from) stays within
   ``max_wal_bytes``, and the slot is not within ``max_wal_bytes`` of being lost to
   ``max_slot_wal_keep_size`` (``safe_wal_size``).

For 3, WAL always moves (other databases, tables outside the publications, checkpoints), so a
flushed WAL position equal to ``confirmed_flush_lsn`` proves idleness for free but is rare on a
busy server. Otherwise the slot is peeked up to the flushed position for at most one change,
with the drain's own pgoutput options: pgoutput (15+) sends nothing for a transaction without a
published change, so no row back means no change to drain. The slot does not move. While it
does not, the WAL it holds grows with the server's other traffic: past ``max_wal_bytes`` the
run is not idle, and the application drains (an empty window: the slot advances), so an idle
publication pins at most that much WAL, and a peek decodes at most that much. A
``restart_lsn`` left far behind ``confirmed_flush_lsn`` (a transaction open across the last
drain) counts from where it is: such a slot is drained until an advance moves it on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_pglogrepl.pipeline.readers import peek_options, published_before
from airflow_pglogrepl.pipeline.source import DrainSource

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from airflow_pglogrepl.lake.coverage import Coverage
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.models.records import SlotInfo


class IdleSource(DrainSource, Protocol):
    """The drain's source (the Airflow hook), and the lake's writer lock it takes."""

    def writer_lock(self, slot: str, *, role: str) -> AbstractContextManager[object]: ...


log = logging.getLogger("airflow_pglogrepl.drain")

IDLE_WAL_BYTES = 16 * 1024 * 1024  # one WAL segment (default size)


@dataclass(frozen=True)
class Idle:
    """An idle run: where the slot and the lake stand, and why nothing is to do."""

    confirmed: LSN
    flush: LSN
    reason: str


@dataclass(frozen=True)
class IdleCheck:
    """The drain's first question about one lake and its slot, with the run's settings:
    ``IdleCheck(hook, lake_root=..., ...).run(slot)`` is the run's ``Idle``, or None."""

    hook: IdleSource
    lake_root: str
    publications: Sequence[str]
    materialize: bool
    max_wal_bytes: int
    history: Sequence[str] = ()  # tables whose history the run keeps ('*': every table)

    def run(self, slot: SlotInfo) -> Idle | None:
        """The run's ``Idle`` when it has nothing to drain or merge, else None (with the reason
        logged). Any error while deciding is logged and answers None: the application decides."""
        from airflow_pglogrepl.exceptions import LakeWriterBusyError

        try:
            # Judged under the lake's writer lock, as a drain would hold it: no other run
            # commits to the lake or moves the slot between the reads below, and the peek never
            # holds the slot while another run's drain peeks it (that run would fail: slot
            # active). Another holder: LakeWriterBusyError, and the run is submitted.
            with self.hook.writer_lock(slot.name, role="idle-check"):
                return self.judge(self.hook.get_slot(slot.name))
        except LakeWriterBusyError:  # said once: by the application, with who holds it and the fix
            log.info("another run holds the writer lock of slot %s's lake: the application is "
                     "started and reports it", slot.name)  # fmt: skip
            return None
        except Exception as exc:  # the application meets the same error and reports it properly
            log.info("could not tell whether slot %s has anything to drain (%s: %s): submitting",
                     slot.name, type(exc).__name__, exc)  # fmt: skip
            return None

    def judge(self, slot: SlotInfo) -> Idle | None:
        """The verdict on ``slot`` as read under the writer lock: 1, 2 and 3 of the module's
        list, the cheap reads first."""
        confirmed = slot.confirmed_flush_lsn
        recorded = None if confirmed is None else self._lake_settled(slot, confirmed)
        if confirmed is None or recorded is None:
            return None
        flush = self.hook.flush_lsn()
        if flush <= confirmed:
            return Idle(confirmed, flush, "no WAL was written after the slot's confirmed_flush_lsn")
        if not self._slot_may_wait(slot, confirmed, flush):
            return None
        missing = self.hook.missing_publications(list(self.publications))
        if missing:
            log.info("publication(s) %s missing: the application reports it", ", ".join(missing))
            return None
        if self._coverage_moved(recorded):
            return None
        began = time.monotonic()
        if published_before(self.hook, slot.name, peek_options(self.publications), flush):
            log.info("slot %s has changes to drain after %s: Spark submitted", slot.name,
                     confirmed)  # fmt: skip
            return None
        return Idle(
            confirmed,
            flush,
            f"no published change in the {flush - confirmed} WAL bytes after the slot's "
            f"confirmed_flush_lsn (peeked in {time.monotonic() - began:.2f} s)",
        )

    def _lake_settled(self, slot: SlotInfo, confirmed: LSN) -> Coverage | None:
        """The slot is free, the lake stands where it does, nothing is quarantined, (when the
        run merges) nothing waits for its merge, and the lake records what it covers with no
        table incomplete: 1 and 2 of the module's list. Its coverage record, or None."""
        from airflow_pglogrepl.lake import coverage
        from airflow_pglogrepl.lake.lake import Lake
        from airflow_pglogrepl.lake.quarantine import held
        from airflow_pglogrepl.merge.materialize import pending_tables
        from airflow_pglogrepl.pipeline.coverage import WARN_ONLY

        if slot.active:
            log.info("slot %s is in use by backend %s: Spark submitted, the application "
                     "reports it", slot.name, slot.active_pid)  # fmt: skip
            return None
        lake = Lake(self.lake_root, slot.name)
        position = lake.position()
        if position != confirmed:
            log.info("lake at %s, slot %s at %s: the application reconciles them (Spark "
                     "submitted)", position, slot.name, confirmed)  # fmt: skip
            return None
        quarantined = held(lake)
        if quarantined:  # the run reports them (and fails, unless told to warn)
            log.info("tables in the lake's quarantine (%s): Spark submitted",
                     ", ".join(map(str, quarantined)))  # fmt: skip
            return None
        pending = pending_tables(lake) if self.materialize else []
        if pending:
            log.info("%d table(s) wait for their merge (%s): Spark submitted",
                     len(pending), ", ".join(pending[:5]))  # fmt: skip
            return None
        behind = self._histories_behind(lake)
        if behind:
            log.info("%d table(s) wait for their history (%s): Spark submitted",
                     len(behind), ", ".join(behind[:5]))  # fmt: skip
            return None
        from airflow_pglogrepl.lake import backfill

        going = sorted(backfill.read(lake).plans)
        if going:  # the run copies their chunks and builds their state
            log.info("backfills in progress (%s): Spark submitted", ", ".join(going[:5]))
            return None
        recorded = coverage.read(lake)
        failing = [
            g for g in (recorded.gaps.values() if recorded else ()) if g.reason not in WARN_ONLY
        ]
        if recorded is None or failing:  # the run records it, or repairs or reports them
            log.info("the lake records no coverage yet, or names incomplete tables: Spark "
                     "submitted")  # fmt: skip
            return None
        return recorded

    def _histories_behind(self, lake: Any) -> list[str]:
        from airflow_pglogrepl.merge.history import histories_behind

        if not self.history:
            return []
        return histories_behind(lake, True if "*" in self.history else list(self.history))

    def _coverage_moved(self, recorded: Coverage) -> bool:
        """The publications cover other relations or partitions than the lake records: a
        table added or a partition attached sends nothing a peek would see."""
        from airflow_pglogrepl.pipeline.coverage import judge, known

        now = self.hook.publication_coverage(list(self.publications), known=known(recorded))
        if judge(recorded, now, "").holds_as(recorded):
            return False
        log.info("the publications cover other tables or partitions than the lake records: "
                 "Spark submitted")  # fmt: skip
        return True

    def _slot_may_wait(self, slot: SlotInfo, confirmed: LSN, flush: LSN) -> bool:
        """Whether leaving the slot where it is keeps the WAL it holds within
        ``max_wal_bytes``, and the slot that far from being lost: the bound of 3."""
        # The WAL the slot holds, and every peek decodes again, starts at restart_lsn, not at
        # confirmed_flush_lsn: a transaction open across the last drain left restart_lsn
        # behind, and only an advance moves it on.
        restart = min(slot.restart_lsn or confirmed, confirmed)
        if flush - restart > self.max_wal_bytes:
            log.info("slot %s holds %d WAL bytes from its restart_lsn %s (%d past its "
                     "confirmed_flush_lsn %s), more than %d: the application drains, so the "
                     "slot moves on", slot.name, flush - restart, restart, flush - confirmed,
                     confirmed, self.max_wal_bytes)  # fmt: skip
            return False
        safe = slot.safe_wal_size  # None: max_slot_wal_keep_size is -1 (no limit)
        if safe is not None and safe < self.max_wal_bytes:
            log.info("slot %s is lost after %d more WAL bytes (max_slot_wal_keep_size), fewer "
                     "than an idle run may leave (%d): the application drains, so the slot moves "
                     "on (a smaller idle_wal_bytes lets such a run skip)", slot.name, safe,
                     self.max_wal_bytes)  # fmt: skip
            return False
        return True


def idle_summary(slot: str, idle: Idle, *, materialize: bool, started: float,
                 history: bool = False) -> dict[str, Any]:  # fmt: skip
    """The summary an idle run reports: the application's keys, with nothing drained or merged
    and no Spark started."""
    from airflow_pglogrepl.pipeline.results import DrainResult

    result = DrainResult(
        slot=slot,
        windows=[],
        confirmed_before=idle.confirmed,
        confirmed_after=idle.confirmed,
        run_end=idle.flush,
        startup_s=time.monotonic() - started,
        lag_bytes_left=max(0, idle.flush - idle.confirmed),
    ).to_dict()
    if materialize:
        result["drain_peak_rss_mb"] = result.get("peak_rss_mb")
        result["materialized"] = {}
        result["materialize_s"] = 0.0
    if history:
        result["history"] = {}
        result["history_s"] = 0.0
    result["table_versions"] = {}
    result["spark_start_s"] = None
    return result
