"""Decisions sensors, triggers and health checks share: facts in, a ``Verdict`` out.

Keeping the decision pure means poke mode (sync hook) and deferrable mode (async trigger) give
the same answer from the same facts, and every rule is unit-tested without a server.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from airflow_pglogrepl.exceptions import (
    SlotError,
    SlotInUseError,
    SlotLostError,
    lost_slot_message,
)
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import REL_STATES, SlotInfo, SlotSpill, SubscriptionStatus


@dataclass(frozen=True)
class Verdict:
    """``done``: the condition holds. ``failed``: it never will without a human (fail fast)."""

    done: bool
    message: str
    failed: bool = False
    data: dict[str, Any] = field(default_factory=dict)


def subscription_ready(
    status: SubscriptionStatus,
    *,
    max_sync_errors: int,
    workerless_s: float,
    worker_grace_s: float,
) -> Verdict:
    """Every table of the subscription in state ``r``; fail fast when sync cannot finish.

    ``workerless_s`` is how long the sensor has seen no running worker while tables are not
    ready; past ``worker_grace_s`` the subscription is judged stuck (the launcher normally
    starts workers within seconds).
    """
    name = status.name
    if not status.exists:
        return Verdict(
            False,
            f"subscription {name!r} does not exist on the subscriber. Fix: create it first "
            f"(CreateSubscriptionOperator) or check the subscriber connection and database",
            failed=True,
        )
    data = status.to_dict()
    counts = ", ".join(
        f"{REL_STATES.get(s, s)}={n}" for s, n in sorted(status.state_counts.items())
    )
    pending = status.not_ready
    if status.relations and not pending:
        return Verdict(
            True, f"subscription {name!r}: all {len(status.relations)} tables ready", data=data
        )
    if not status.relations:
        return Verdict(
            False, f"subscription {name!r} has no tables in pg_subscription_rel yet", data=data
        )
    waiting = ", ".join(f"{rel.table} ({REL_STATES.get(rel.state, rel.state)})" for rel in pending)
    errors = status.sync_error_count or 0
    if errors >= max_sync_errors:
        return Verdict(
            False,
            f"subscription {name!r}: table synchronisation failed {errors} times "
            f"(pg_stat_subscription_stats.sync_error_count) and these tables are not ready: "
            f"{waiting}. The subscriber's server log has each error (often a duplicate key: rows "
            f"already present on the subscriber, or a missing column). Fix the cause, then "
            f"ALTER SUBSCRIPTION ... REFRESH PUBLICATION or recreate the subscription",
            failed=True,
            data=data,
        )
    if not status.enabled:
        return Verdict(
            False,
            f"subscription {name!r} is disabled while tables are not ready: {waiting}. Fix: "
            f"ALTER SUBSCRIPTION ... ENABLE (AlterSubscriptionOperator action='enable')",
            failed=True,
            data=data,
        )
    if status.workers == 0 and workerless_s >= worker_grace_s:
        return Verdict(
            False,
            f"subscription {name!r} is enabled but no apply or sync worker has run for "
            f"{workerless_s:.0f}s while tables are not ready: {waiting}. Check "
            f"max_logical_replication_workers/max_worker_processes on the subscriber and its "
            f"server log",
            failed=True,
            data=data,
        )
    return Verdict(False, f"subscription {name!r}: {counts}; waiting for {waiting}", data=data)


def slot_lag(slot: SlotInfo, *, max_lag_bytes: int) -> Verdict:
    """The slot's confirmed position within ``max_lag_bytes`` of the server's current WAL."""
    data = slot.to_dict()
    if slot.wal_status == "lost":
        return Verdict(False, _lost(slot), failed=True, data=data)
    if slot.confirmed_flush_lsn is None:
        return Verdict(False, f"slot {slot.name!r} has no confirmed_flush_lsn yet", data=data)
    lag = max(0, slot.current_lsn - slot.confirmed_flush_lsn)
    data["lag_bytes"] = lag
    verdict = "within" if lag <= max_lag_bytes else "above"
    return Verdict(
        lag <= max_lag_bytes,
        f"slot {slot.name!r}: lag {lag} bytes ({slot.confirmed_flush_lsn} -> {slot.current_lsn}),"
        f" {verdict} {max_lag_bytes}",
        data=data,
    )


def reached(position: LSN | None, target: LSN, *, what: str) -> Verdict:
    """``position`` (a confirmed LSN) at or past ``target``."""
    data: dict[str, Any] = {"position": str(position) if position else None, "target": str(target)}
    if position is None:
        return Verdict(False, f"{what} has no position yet; target {target}", data=data)
    behind = max(0, target - position)
    data["behind_bytes"] = behind
    if position >= target:
        return Verdict(True, f"{what} at {position}, target {target} reached", data=data)
    return Verdict(False, f"{what} at {position}, {behind} bytes before {target}", data=data)


def _lost(slot: SlotInfo) -> str:
    return lost_slot_message(slot.name, slot.invalidation_reason, "it cannot be consumed")


@dataclass(frozen=True)
class HealthPolicy:
    """Thresholds for ``slot_health``; ``None`` switches a check off."""

    plugin: str | None = None
    max_retained_bytes: int | None = None
    max_retained_fraction: float | None = None
    max_inactive: dt.timedelta | None = None
    allow_active: bool = True


def slot_health(
    slot: SlotInfo,
    policy: HealthPolicy,
    *,
    max_slot_wal_keep_size: int | None,
    inactive_since: dt.datetime | None,
    now: dt.datetime,
    temp_file_limit: int | None = None,
    spill: SlotSpill | None = None,
    idle_timeout_s: int | None = None,
    in_recovery: bool = False,
) -> list[str]:
    """Problems with a slot (empty when healthy), each naming the slot and the fix.

    ``idle_timeout_s`` is the server's ``idle_replication_slot_timeout`` (PostgreSQL 18): an
    inactive slot is reported once it has used half of it, before a checkpoint invalidates it.
    A standby's (``in_recovery``) synchronized copy of a failover slot is exempt, as the server
    exempts it; once the standby is promoted the copy keeps ``synced`` and is not.
    """
    problems: list[str] = []
    name = slot.name
    largest = spill.largest_at_least if spill is not None else 0
    if temp_file_limit is not None and largest >= temp_file_limit:
        problems.append(temp_file_limit_problem(name, temp_file_limit, largest))
    if policy.plugin is not None and slot.plugin != policy.plugin:
        problems.append(
            f"slot {name!r} uses plugin {slot.plugin!r}, expected {policy.plugin!r}. Fix: create "
            f"a separate slot with plugin {policy.plugin!r}"
        )
    if slot.wal_status == "lost":
        problems.append(_lost(slot))
    elif slot.wal_status == "unreserved":
        problems.append(
            f"slot {name!r} is unreserved (wal_status = unreserved): the WAL it needs is past "
            f"max_slot_wal_keep_size and will be removed at the next checkpoint. Fix: consume "
            f"or advance the slot now, or raise max_slot_wal_keep_size"
        )
    retained = slot.retained_bytes or 0
    if policy.max_retained_bytes is not None and retained > policy.max_retained_bytes:
        problems.append(
            f"slot {name!r} retains {retained} bytes of WAL, above {policy.max_retained_bytes}. "
            f"Fix: let its consumer catch up (or drop the slot if it is abandoned)"
        )
    if policy.max_retained_fraction is not None and max_slot_wal_keep_size:
        fraction = retained / max_slot_wal_keep_size
        if fraction > policy.max_retained_fraction:
            problems.append(
                f"slot {name!r} retains {fraction:.0%} of max_slot_wal_keep_size "
                f"({retained} of {max_slot_wal_keep_size} bytes), above "
                f"{policy.max_retained_fraction:.0%}: it will be invalidated when it reaches 100%"
            )
    if not policy.allow_active and slot.active:
        problems.append(
            f"slot {name!r} is active in another session (PID {slot.active_pid}); a slot has one "
            f"consumer at a time. Fix: stop that consumer or use another slot"
        )
    if policy.max_inactive is not None and not slot.active and inactive_since is not None:
        idle = now - inactive_since
        if idle > policy.max_inactive:
            problems.append(
                f"slot {name!r} has been inactive for {idle} (since {inactive_since.isoformat()}),"
                f" more than {policy.max_inactive}; it keeps WAL while nobody reads it. Fix: "
                f"restart its consumer or drop it"
            )
    exempt = slot.active or (slot.synced and in_recovery)  # (as the server exempts them)
    if idle_timeout_s is not None and not exempt and inactive_since is not None:
        idle = now - inactive_since
        limit = dt.timedelta(seconds=idle_timeout_s)
        if idle * 2 >= limit and slot.wal_status != "lost":
            left = max(limit - idle, dt.timedelta(0))
            problems.append(
                f"slot {name!r} has been inactive for {idle} and idle_replication_slot_timeout "
                f"is {limit}: the first checkpoint after {left} more invalidates it for good. "
                f"Fix: run its consumer now and more often than that, or raise "
                f"idle_replication_slot_timeout (0 turns it off)"
            )
    return problems


def temp_file_limit_problem(slot: str, limit: int, largest: int) -> str:
    """A peek holds a window's whole result, at least its biggest transaction, in a temporary
    file: past ``temp_file_limit`` it fails, every time, while the slot keeps WAL."""
    return (
        f"slot {slot!r}: temp_file_limit is {limit} bytes, and transactions this slot decoded "
        f"were at least {largest} bytes (pg_stat_replication_slots: spilled or streamed ones, "
        f"on average). A drain's peek holds a window, and at least its biggest transaction, in "
        f"a temporary file: a window holding such a transaction fails every time while WAL "
        f"piles up. Fix: ALTER ROLE <drain role> SET temp_file_limit = -1 (a superuser may), "
        f"or raise it above the biggest transaction"
    )


def drain_refusal(slot: SlotInfo) -> SlotError | None:
    """Why ``slot`` cannot be drained now, or None: lost first (no retry helps), then in use by
    another session (one may, later). ``SlotDrainOperator`` asks before Spark starts and the
    drain application asks again (the slot can change in between): the same rule, in one place.
    """
    if slot.wal_status == "lost":
        return SlotLostError(slot.name, slot.invalidation_reason)
    if slot.active:
        return SlotInUseError(slot.name, slot.active_pid)
    return None
