"""What a drain run is given to repair the gaps its coverage check finds (``pipeline.coverage``):
the tables whose state the WAL could not keep equal to the source.

The run calls it once with the gaps, before it reads the slot, then after every window it
commits (``after_window``); a bounded run whose repair is still ``pending`` when its windows
are done goes on, copying and draining in turn (``Drain``). Two repairs exist: the whole-table
re-snapshot (``spark.resnapshot``) and the online backfill (``spark.backfill``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake.coverage import Gap

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.pipeline.source import DrainSource

__all__ = ["REPAIR_S", "Repair", "asked_gap", "go_on"]

log = logging.getLogger("airflow_pglogrepl.drain")

# A run's rounds of repair (a step, then the windows written meanwhile) after its own windows,
# at most; how long it waits for the source to flush past a backfill's last chunk; and how long
# it goes on repairing (the other tables' states are merged when it ends: the next run goes on
# from the last chunk copied).
REPAIR_ROUNDS = 100_000
FLUSH_WAIT_S = 5.0
REPAIR_S = 600.0
# How long a round with nothing new to drain waits for a step taken in the background.
WAIT_S = 1.0


class Repair:
    """The base: a repair that does all its work when called, and nothing after a window."""

    def __call__(self, gaps: Mapping[str, Gap]) -> dict[str, str | None]:
        """Each table it tried: None when its state is whole again, else why not. A table
        still being repaired (``in_progress``) is absent."""
        raise NotImplementedError

    def in_progress(self) -> list[str]:
        """Tables being repaired across windows and runs: reported, not failed."""
        return []

    def pending(self) -> bool:
        """Whether the run has repair work left that it may still do."""
        return False

    def after_window(self, end: LSN) -> None:
        """A window committed at ``end``: a step of the repair may follow."""

    def waiting_for(self) -> LSN | None:
        """The lake position the repair waits for, if it waits for one."""
        return None

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a step it takes in the background (none here)."""

    def settle(self, *, failed: bool = False) -> list[str]:
        """At the run's end, whatever it did: wait for a step taken in the background and take
        its outcome (the tables it made whole; a run that ``failed`` leaves it to the next
        run), so nothing goes on once the run's lock is released."""
        return []

    def report(self) -> dict[str, dict[str, Any]]:
        """The summary's ``backfills``."""
        return {}

    def parity_report(self) -> dict[str, dict[str, Any]]:
        """The summary's ``parity``: what the parity checks that ended in the run found."""
        return {}


def go_on(repair: Repair | None, *, lake: Lake, source: DrainSource, drained: bool,
          drain: Callable[[LSN, LSN], None]) -> None:  # fmt: skip
    """A bounded run whose repair has work left goes on: a step of it (a backfill's chunk, or
    the build of its state), then the windows the source wrote meanwhile (``drain``), in turn,
    until the repair is done or cannot move in this run. ``drained``: windows just committed
    (each took a step already)."""
    until = time.monotonic() + REPAIR_S
    for _ in range(REPAIR_ROUNDS):
        if repair is None or not repair.pending():
            return
        if time.monotonic() > until:  # the states of the other tables wait for its end
            log.info("the run's repair time is up: the next run goes on with it")
            return
        position = lake.position()
        assert position is not None, "a run that repairs has committed its lake"
        if not drained:
            repair.after_window(position)
            if not repair.pending():
                return
        waiting = repair.waiting_for()
        end = source.flush_lsn()
        deadline = time.monotonic() + FLUSH_WAIT_S
        while waiting is not None and end < waiting and time.monotonic() < deadline:
            time.sleep(0.05)  # the WAL writer flushes within wal_writer_delay
            end = source.flush_lsn()
        if waiting is not None and end < waiting:
            log.warning("the source has not flushed past %s: the backfill's state is built by "
                        "the next run", waiting)  # fmt: skip
            return
        drained = position < end
        if drained:
            drain(position, end)
        else:  # nothing new to drain: a step in the background (a state being built) goes on
            repair.wait(WAIT_S)


def asked_gap(table: str, what: str, since: str) -> Gap:
    """What a run reports of a repair asked for (a resync, a parity check) that it could not
    do: as a gap, so that the task fails naming it."""
    return Gap(table=table, reason="asked", what=f"the {what} asked for could not be done",
               fix="see why under 'repair', and fix its cause; the next run tries again",
               since=since)  # fmt: skip
