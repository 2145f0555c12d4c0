"""What the lake records of its snapshots, and what an initial snapshot run must do about it.

A lake's initial snapshot is its first committed entry (``Lake.record(kind="snapshot")``); a
snapshot that was killed leaves staged copies or published state tables without a position
(``resolve`` reports them, ``remove_leftovers`` takes them away before the next one). The rule
that decides between keeping, creating and replacing the slot (``bootstrap_plan``) is the same
for ``InitialSnapshotOperator`` on the worker and for the snapshot application: reading the lake
needs no Spark.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.exceptions import LakeNotEmptyError, SlotError
from airflow_pglogrepl.lake import staging
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN

log = logging.getLogger("airflow_pglogrepl.snapshot")


def existing_snapshot(lake: Lake) -> dict[str, Any] | None:
    """The lake's initial snapshot (its first committed entry, when that is a snapshot)."""
    windows = lake.windows()
    first = windows[0] if windows else None
    return first if first is not None and first["kind"] == "snapshot" else None


def snapshot_committed(lake: Lake, consistent_point: LSN) -> bool:
    """Whether the lake holds a snapshot committed at ``consistent_point``."""
    return any(
        w["kind"] == "snapshot" and LSN(w["end_lsn"]) == consistent_point for w in lake.windows()
    )


def resolve(lake: Lake, consistent_point: LSN | None = None) -> dict[str, Any]:
    """Where the lake stands for its slot (read only: a lake never needs repairing).

    Returns ``commits`` (windows and snapshots committed), ``snapshot_lsn`` (the consistent point
    of its initial snapshot, or None) and, with ``consistent_point``, ``committed`` (whether that
    snapshot is committed).
    """
    windows = lake.windows()
    existing = existing_snapshot(lake)
    status: dict[str, Any] = {
        "commits": len(windows),
        "snapshot_lsn": existing["end_lsn"] if existing else None,
        # what killed snapshots left in a lake with nothing committed, at the consistent
        # points they were taken at: copies staged (killed while copying) and state tables
        # published (killed while publishing)
        "uncommitted_snapshots": _uncommitted(lake) if not windows else [],
    }
    if consistent_point is not None:
        status["committed"] = snapshot_committed(lake, consistent_point)
    return status


def _uncommitted(lake: Lake) -> list[str]:
    staged = staging.staged_points(f"{lake.root}/state")
    published = [v for t in lake.state_tables() if (v := lake.state_version(t)) is not None]
    return sorted({str(point) for point in [*staged, *published]})


@dataclass(frozen=True)
class BootstrapPlan:
    """What an initial snapshot run does: ``exists`` (the lake holds this slot's snapshot),
    ``drained`` (drained without one; bootstrap leaves it), ``replace_slot`` (drop the slot and
    re-create it with an exported snapshot) or ``create`` (create the slot)."""

    action: str
    snapshot_lsn: str | None = None


def bootstrap_plan(
    *,
    slot: str,
    slot_exists: bool,
    status: dict[str, Any],
    lake: str,
    replace_slot: bool,
    bootstrap: bool = False,
    slot_lsn: str | None = None,
) -> BootstrapPlan:
    """One rule for ``InitialSnapshotOperator`` and ``snapshot_app``: from whether the slot
    exists (at ``slot_lsn``, its ``confirmed_flush_lsn``) and where the lake stands
    (``resolve``), what to do, or why not (raises).

    A slot is never replaced while the lake holds commits: the lake depends on it. Nor just
    because the lake looks empty: an unmounted volume or a changed lake path look empty too,
    and dropping the slot would lose every change it holds for the real lake. Without
    ``replace_slot``, bootstrap replaces it only when the lake holds the uncommitted snapshot
    a killed run took at exactly the slot's position (it never moved since).
    """
    if slot_exists and status.get("snapshot_lsn"):
        return BootstrapPlan("exists", status["snapshot_lsn"])
    if status.get("commits"):
        if slot_exists and bootstrap:
            return BootstrapPlan("drained")
        why = (
            f"but no snapshot of slot {slot!r}: it is drained without one"
            if slot_exists
            else f"and slot {slot!r} does not exist: the lake cannot continue"
        )
        raise LakeNotEmptyError(
            f"lake {lake} holds {status['commits']} commits {why}. Nothing was changed. An "
            f"initial snapshot starts a new, empty lake"
        )
    if slot_exists:
        left = status.get("uncommitted_snapshots") or []
        if replace_slot or (bootstrap and slot_lsn is not None and slot_lsn in left):
            return BootstrapPlan("replace_slot")
        raise SlotError(
            slot,
            f"slot {slot!r} already exists (at {slot_lsn or 'an unknown position'}) and lake "
            f"{lake} holds nothing of it: a snapshot can only be exported when the slot is "
            f"created, and the slot was left alone. If the lake should hold data (a volume not "
            f"mounted, a changed lake path or PGLOGREPL_LAKE), fix the path: dropping the slot "
            f"would lose every change it holds for the real lake. If the slot is what a killed "
            f"snapshot left behind, set replace_slot=True (--replace-slot) or drop the slot",
        )
    return BootstrapPlan("create")


def temporary_slot_name(slot: str) -> str:
    """A name for the temporary slot of a re-snapshot next to ``slot`` (unique per process)."""
    suffix = f"_rs{os.getpid()}"
    return slot[: 63 - len(suffix)] + suffix


def check_empty_lake(lake: Lake) -> None:
    """Refuse an initial snapshot into a lake that already holds committed data.

    Staged copies and state tables without a committed position are what an interrupted
    snapshot left (its slot was dropped): the snapshot removes them (``remove_leftovers``). A
    changelog without one is a drain's first window that never committed: drain again, or
    remove ``changes/``.
    """
    position = lake.position()
    if position is not None:
        raise LakeNotEmptyError(
            f"lake {lake.root} already holds commits of slot {lake.slot!r} up to {position}; "
            f"an initial snapshot starts a new lake. Fix: drain it as it is, re-snapshot "
            f"single tables (tables=...), or use an empty lake"
        )
    if lake.changes_tables():
        raise LakeNotEmptyError(
            f"lake {lake.root} has tables under changes/ but no committed window of slot "
            f"{lake.slot!r}: a drain began there and never committed, or another slot wrote "
            f"them. Fix: run that drain again, or move changes/ away, or use an empty lake"
        )


def remove_leftovers(lake: Lake) -> list[str]:
    """Before an initial snapshot into a lake without a position (``check_empty_lake``): remove
    what killed snapshots of its slot left under ``state/`` (``staging.leftovers``); returns
    what was removed."""
    removed = staging.leftovers(f"{lake.root}/state", lake.app)
    for uri in removed:
        log.warning("removing %s: left by a snapshot that never committed", uri)
        staging.remove(uri)
    return removed
