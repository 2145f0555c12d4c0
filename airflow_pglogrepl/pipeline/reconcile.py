"""Before a drain reads anything: is this lake the slot's, and where do the two stand?

The lake's position is compared with the slot's ``confirmed_flush_lsn``. Lake ahead means an
advance was lost (PostgreSQL persists an advanced position only at the next checkpoint), so the
slot is moved up to the lake; slot ahead means someone else consumed changes the lake never saw,
and the run stops, naming both LSNs. A lake written from another server or timeline, claimed by
another slot, or whose initial snapshot never committed is refused before a byte is written.

A later timeline of the same server is a promotion (or a switchover): the lake goes on there
when its timeline is an ancestor of the current one, left at or after the lake's position. A
failover slot synchronized to the standby is then at or behind the lake, and is moved up to it.
Left before the lake's position, the new primary never had part of what the lake holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from airflow_pglogrepl.exceptions import (
    LakeFromAnotherSourceError,
    LakePastFailoverError,
    LakeSnapshotUnfinishedError,
    SlotAheadOfLakeError,
)
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.source import DrainSource
from airflow_pglogrepl.pipeline.upgrade import carried_over

__all__ = ["claim", "reconcile"]

log = logging.getLogger("airflow_pglogrepl.drain")


def claim(lake: Lake, source: DrainSource, slot: str, publications: Sequence[str], *,
          accept_source_change: bool) -> None:  # fmt: skip
    """Refuse a lake of another slot, server or database, or one whose initial snapshot never
    committed, before anything is read or written; record the lake's identity at its first run
    (``Lake.claim``)."""
    identity = lake.claim(
        source.source_identity(),
        publications=list(publications),
        began_with="drain",
        accept_source_change=accept_source_change,
    )
    if identity.get("began_with") == "snapshot" and lake.position() is None:
        from airflow_pglogrepl.lake.snapshots import resolve

        left = resolve(lake).get("uncommitted_snapshots") or []
        raise LakeSnapshotUnfinishedError(lake.root, slot, identity.get("created_at"), left)


def _promoted(lake: Lake, source: DrainSource, slot: str, recorded: dict[str, object],
              current: dict[str, object], lake_lsn: LSN, *, ahead: bool) -> bool:  # fmt: skip
    """Whether the source is the lake's server promoted (or switched over) from a standby
    that had everything the lake drained: the lake's timeline is an ancestor of the current
    one, left at or after the lake's position (``postgres.timelines``). A timeline left before
    it raises ``LakePastFailoverError``; one that is no ancestor (another history) is not a
    promotion."""
    old, new = recorded.get("timeline"), current.get("timeline")
    if not isinstance(old, int) or not isinstance(new, int) or new <= old:
        return False
    switch = source.switch_points(new).get(old)
    if switch is None:
        return False
    reach, held_by = _reach(lake, lake_lsn)
    if reach > switch:
        raise LakePastFailoverError(slot, lake.root, reach, old, switch, new, held_by=held_by)
    log.warning(
        "slot %s is on timeline %s of the server lake %s was drained from on timeline %s "
        "(a promotion or switchover, which left timeline %s at %s; the lake is at %s, before "
        "it): draining on%s", slot, new, lake.root, old, old, switch, lake_lsn,
        ", from the lake's position (the synchronized slot is behind it)" if ahead else "",
    )  # fmt: skip
    return True


def _reach(lake: Lake, position: LSN) -> tuple[LSN, str | None]:
    """The furthest WAL position the lake holds anything of, and the table that holds it (None:
    the position itself). A table's changelog is committed before the window's commit point, so
    a run killed between the two leaves it past the position; a re-snapshot's state is at its
    own consistent point. Either is a floor below which the drain skips that table's rows."""
    furthest, held_by = position, None
    for name in sorted({*lake.changes_tables(), *lake.state_tables()}):
        held = lake.covered(name)
        if held is not None and held > furthest:
            furthest, held_by = held, name
    return furthest, held_by


def reconcile(lake: Lake, source: DrainSource, slot: str, slot_lsn: LSN, *,
              accept_source_change: bool, publications: Sequence[str] = ()) -> LSN:  # fmt: skip
    """Where the run starts: the slot's ``slot_lsn``, or the lake's position when the slot's
    last advance was lost (the slot is moved up to it first); after ``pg_upgrade``, when asked,
    the slot it carried over (``pipeline.upgrade``)."""
    lake_lsn = lake.position()
    recorded = lake.recorded_source()
    current = lake.source or {}
    ahead = lake_lsn is not None and lake_lsn > slot_lsn
    other_system = recorded is not None and (
        recorded.get("system_identifier") != current.get("system_identifier")
    )
    other_timeline = recorded is not None and recorded.get("timeline") != current.get("timeline")
    promoted = False
    if other_timeline and not other_system and lake_lsn is not None and not accept_source_change:
        assert recorded is not None
        promoted = _promoted(lake, source, slot, recorded, current, lake_lsn, ahead=ahead)
    # a timeline that is not the lake's own promoted is another history: its LSNs past the fork
    # are not the lake's, whichever of lake and slot is ahead
    changed = other_system or (other_timeline and lake_lsn is not None and not promoted)
    if changed and not accept_source_change:
        raise LakeFromAnotherSourceError(slot, lake.root, recorded or {}, current)
    if changed:
        log.warning(
            "lake %s was written from %s, the slot is on %s: draining on as asked "
            "(accept_source_change), and recording the new source", lake.root, recorded, current,
        )  # fmt: skip
    if ahead and recorded is None:
        log.warning(
            "lake %s records no source identity (its last commit predates them): "
            "advancing slot %s to it unchecked", lake.root, slot,
        )  # fmt: skip
    if lake_lsn is None:
        log.info("empty lake: starting at the slot's confirmed_flush_lsn %s", slot_lsn)
        return slot_lsn
    if lake_lsn > slot_lsn:
        why = ("its synchronized copy on the promoted standby was behind the lake" if promoted
               else "the last advance was lost")  # fmt: skip
        log.warning(
            "lake is ahead of slot %s (%s > %s): %s; advancing the slot to the lake, committed "
            "changes are not drained again", slot, lake_lsn, slot_lsn, why,
        )  # fmt: skip
        lake.check_writer()
        source.advance_slot(slot, lake_lsn)
        return lake_lsn
    if slot_lsn > lake_lsn:
        why_not = "the source is the lake's own server"
        if other_system and accept_source_change:
            why_not = carried_over(lake, source, publications, recorded or {}, current) or ""
        if not why_not:
            log.warning(
                "slot %s starts at %s, past lake %s's position %s, on a server of a later major "
                "version with the lake's database (a pg_upgrade, as accept_source_change says): "
                "pg_upgrade carries a slot over only when it has consumed all its WAL, and "
                "creates it at the new cluster's position. Draining on from %s",
                slot, slot_lsn, lake.root, lake_lsn, slot_lsn,
            )  # fmt: skip
            # committed at once, empty: the lake's position and the new source are recorded
            # even when nothing follows, so the next run needs no asking
            Window(lake, lake_lsn).commit(slot_lsn, transactions=0, changes=0)
            return slot_lsn
        if other_system and accept_source_change:
            log.warning("lake %s: the source is not taken for its server after pg_upgrade: %s",
                        lake.root, why_not)  # fmt: skip
        raise SlotAheadOfLakeError(slot, slot_lsn, lake_lsn, lake.root)
    return slot_lsn
