"""Failover slots (PostgreSQL 17+), decided from facts alone: whether a new slot is made one,
and whether a promotion of the primary would keep the drain's slot, with the fix for each
thing that would lose it.

A failover slot survives a promotion only when a standby holds a synchronized copy of it that
is ready (``synced``, not ``temporary``, not invalidated), and the lake stays exactly once
across it only when the primary let no consumer confirm WAL that standby lacks
(``synchronized_standby_slots``). The primary alone cannot see the copy: the standby is asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pglogrepl.exceptions import FailoverSlotUnsupportedError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import Record, SlotInfo
from airflow_pglogrepl.versions import Features

__all__ = [
    "FailoverPrimary",
    "FailoverReadiness",
    "FailoverStandby",
    "failover_readiness",
    "wants_failover",
]

DOCS = "docs/high-availability.md"


def wants_failover(slot: str, server: str, version_num: int, *, in_hot_standby: bool,
                   requested: bool | None, temporary: bool = False) -> bool:  # fmt: skip
    """Whether to create ``slot`` as a failover slot. ``requested=None``: wherever the server
    can keep one (a primary of 17 or later, a permanent slot); ``True`` where it cannot raises
    ``FailoverSlotUnsupportedError`` naming why."""
    features = Features.of(version_num)
    if requested is None:
        return features.failover_slots and not in_hot_standby and not temporary
    if not requested:
        return False
    if not features.failover_slots:
        raise FailoverSlotUnsupportedError(
            slot, server,
            f"failover slots need PostgreSQL 17, and it runs {features.major}; a promotion of "
            f"one of its standbys loses the slot, and the lake then needs a new initial snapshot",
            "leave failover unset (or False) on this server, or upgrade it to 17 or later",
        )  # fmt: skip
    if in_hot_standby:
        raise FailoverSlotUnsupportedError(
            slot, server, "it is a standby (in recovery); only a primary's slots are "
            "synchronized to standbys", "create the slot on the primary",
        )  # fmt: skip
    if temporary:
        raise FailoverSlotUnsupportedError(
            slot, server, "a temporary slot ends with its session",
            "create a permanent slot, or leave failover unset",
        )  # fmt: skip
    return True


@dataclass(frozen=True)
class FailoverPrimary(Record):
    """What the primary says: its version, the drain's slot, and the physical slots its
    ``synchronized_standby_slots`` names (each with whether a standby streams through it now;
    absent: no such slot)."""

    server: str
    version_num: int
    slot: SlotInfo
    synchronized_standby_slots: tuple[str, ...] = ()
    standby_slots_active: dict[str, bool] | None = None
    in_recovery: bool = False
    system_identifier: str | None = None


@dataclass(frozen=True)
class FailoverStandby(Record):
    """What one standby says: whether it is one, its slot sync settings, and its copy of the
    drain's slot (None: it has none). ``conninfo_has_dbname`` is None when the role may not
    read ``primary_conninfo`` (only that fact is kept: the value holds a password)."""

    server: str
    in_recovery: bool
    sync_replication_slots: bool
    hot_standby_feedback: bool
    primary_slot_name: str | None
    conninfo_has_dbname: bool | None
    copy: SlotInfo | None
    wal_level: str = "logical"
    system_identifier: str | None = None


@dataclass(frozen=True)
class FailoverReadiness(Record):
    """The verdict: ``ready`` when a promotion of any checked standby keeps the slot and the
    lake exactly once; ``problems`` each say what is wrong and the fix; ``standby_lag_bytes``:
    how far the most advanced ready copy is behind the primary's slot (a promotion then finds
    it there, and the drain moves it up to the lake)."""

    slot: str
    ready: bool
    problems: tuple[str, ...]
    standbys_ready: tuple[str, ...] = ()
    standby_lag_bytes: int | None = None


def failover_readiness(primary: FailoverPrimary, standbys: Sequence[FailoverStandby],
                       unreachable: Sequence[str] = ()) -> FailoverReadiness:  # fmt: skip
    """Judge whether a promotion of one of ``standbys`` keeps ``primary``'s slot (see the
    module's docstring); no standby checked is a problem: the primary cannot see the copies.
    ``unreachable``: the problems of standbys that could not be asked."""
    slot, server = primary.slot.name, primary.server
    features = Features.of(primary.version_num)
    if not features.failover_slots:
        return FailoverReadiness(slot, False, (
            f"slot {slot!r}: failover slots need PostgreSQL 17, and {server} runs "
            f"{features.major}: a promotion of a standby loses the slot, and the lake then "
            f"needs a new initial snapshot. Fix: upgrade the publisher to 17 or later ({DOCS})",
        ))  # fmt: skip
    problems = _primary_problems(primary) + list(unreachable)
    ready: list[str] = []
    lags: list[int] = []
    for standby in standbys:
        found = _standby_problems(primary, standby)
        problems += found
        if not found and standby.copy is not None:
            ready.append(standby.server)
            lags.append(_lag(primary.slot, standby.copy))
    if not standbys and not unreachable:
        problems.append(
            f"slot {slot!r}: no standby was checked, and {server} cannot see whether one holds "
            f"a synchronized copy. Fix: pass the standbys' connections (standby_conn_ids)"
        )
    return FailoverReadiness(slot, not problems and bool(ready), tuple(problems), tuple(ready),
                             min(lags) if lags else None)  # fmt: skip


def _primary_problems(primary: FailoverPrimary) -> list[str]:
    slot, server = primary.slot.name, primary.server
    if primary.in_recovery:
        return [f"{server} is a standby (in recovery), not the primary whose slot {slot!r} a "
                f"promotion would have to keep. Fix: point postgres_conn_id at the "
                f"primary"]  # fmt: skip
    problems: list[str] = []
    if not primary.slot.failover:
        problems.append(
            f"slot {slot!r} on {server} is not a failover slot: no standby synchronizes it, and "
            f"a promotion loses it. Fix: CreateReplicationSlotOperator(failover=True) makes the "
            f"existing slot one while no consumer holds it, between two drains (or "
            f"ALTER_REPLICATION_SLOT {slot} ( FAILOVER true ) over a replication connection)"
        )
    if not primary.synchronized_standby_slots:
        problems.append(
            f"{server} lets the drain confirm WAL no standby has (synchronized_standby_slots is "
            f"empty): after a failover the lake may hold changes the new primary never had, and "
            f"needs a new initial snapshot (LakePastFailoverError). Fix: set "
            f"synchronized_standby_slots on the primary to the standbys' physical slots"
        )
    active = primary.standby_slots_active or {}
    for name in primary.synchronized_standby_slots:
        if name not in active:
            problems.append(
                f"synchronized_standby_slots on {server} names {name!r}, which is no physical "
                f"slot there: every decode of a failover slot waits for it "
                f"(WaitForStandbyConfirmation). Fix: create the slot for the standby, or remove "
                f"the name from synchronized_standby_slots"
            )
        elif not active[name]:
            problems.append(
                f"no standby streams through {name!r} (synchronized_standby_slots on {server}): "
                f"the drain waits until it does (WaitForStandbyConfirmation). Fix: start the "
                f"standby, or remove the name from synchronized_standby_slots while it is away"
            )
    return problems


def _standby_problems(primary: FailoverPrimary, standby: FailoverStandby) -> list[str]:
    slot, where = primary.slot.name, standby.server
    if not standby.in_recovery:
        return [f"{where} is not a standby (not in recovery): it cannot take over {slot!r}. Fix: "
                f"check standby_conn_ids"]  # fmt: skip
    if standby.system_identifier != primary.system_identifier and None not in (
        standby.system_identifier,
        primary.system_identifier,
    ):
        return [f"{where} is not a standby of {primary.server} (system identifier "
                f"{standby.system_identifier}, not {primary.system_identifier}): a promotion of "
                f"it does not take over {slot!r}. Fix: check standby_conn_ids"]  # fmt: skip
    problems: list[str] = []
    settings = (
        (standby.sync_replication_slots, "sync_replication_slots is off",
         "sync_replication_slots = on"),
        (standby.hot_standby_feedback, "hot_standby_feedback is off",
         "hot_standby_feedback = on"),
        (bool(standby.primary_slot_name), "primary_slot_name is not set",
         "primary_slot_name = '<its physical slot on the primary>'"),
        (standby.conninfo_has_dbname is not False, "primary_conninfo names no dbname",
         "a dbname in primary_conninfo (the slot sync worker connects to a database)"),
        (standby.wal_level == "logical", f"wal_level is {standby.wal_level}",
         "wal_level = logical (a restart)"),
    )  # fmt: skip
    for ok, what, fix in settings:
        if not ok:
            problems.append(f"standby {where} does not synchronize slots: {what}. Fix: {fix} on "
                            f"{where}, then reload it")  # fmt: skip
    named = standby.primary_slot_name
    if (
        named
        and primary.synchronized_standby_slots
        and (named not in primary.synchronized_standby_slots)
    ):
        problems.append(
            f"standby {where} streams through {named!r}, which synchronized_standby_slots on "
            f"{primary.server} does not name: the drain may confirm WAL {where} never received. "
            f"Fix: add {named!r} to synchronized_standby_slots"
        )
    copy = standby.copy
    if copy is None:
        if not problems:
            problems.append(
                f"standby {where} holds no copy of slot {slot!r}: a promotion now loses it. "
                f"Fix: the standby's log says why its slot sync worker does not make one (a "
                f"standby of a standby cannot; a copy is made only once the standby has replayed "
                f"past the slot's position, which takes a moment after the slot is created)"
            )
        return problems
    if not copy.synced:
        problems.append(
            f"standby {where} holds a slot {slot!r} of its own, not synchronized from the "
            f"primary: after a promotion its position has nothing to do with the lake's. Fix: "
            f"drop it on {where} (pg_drop_replication_slot), so the sync worker creates the copy"
        )
    elif copy.invalidation_reason or copy.wal_status == "lost":
        problems.append(
            f"standby {where}'s copy of slot {slot!r} is invalidated "
            f"({copy.invalidation_reason or 'wal_status lost'}): a promotion cannot use it. "
            f"Fix: hot_standby_feedback on with primary_slot_name on {where} keeps catalog "
            f"rows; the copy is created again by the sync worker once dropped"
        )
    elif copy.temporary:
        problems.append(
            f"standby {where}'s copy of slot {slot!r} is not ready yet (temporary until the "
            f"standby has replayed past the primary's slot): a promotion now drops it. Fix: "
            f"wait; it becomes ready once the drain's slot moves on the primary"
        )
    return problems


def _lag(slot: SlotInfo, copy: SlotInfo) -> int:
    ahead, behind = slot.confirmed_flush_lsn, copy.confirmed_flush_lsn
    if ahead is None or behind is None:
        return 0
    return max(0, int(LSN(ahead)) - int(LSN(behind)))
