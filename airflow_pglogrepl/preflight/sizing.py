"""Capacity: are there enough slots, WAL senders and workers for the planned subscriptions?

Each subscription holds one slot and one WAL sender on the publisher and one apply worker on the
subscriber. While tables are first copied, each table-sync worker (up to the subscriber's
``max_sync_workers_per_subscription`` per subscription, never more than there are tables) holds a
temporary slot, a WAL sender and a worker as well. Capacity other replication already holds
(existing slots, running WAL senders and workers) is not free.
See https://www.postgresql.org/docs/15/logical-replication-config.html
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.models.facts import Inspection, PublisherUsage, SubscriberUsage
from airflow_pglogrepl.preflight._text import counted
from airflow_pglogrepl.preflight.report import Check, Finding, Severity, Side
from airflow_pglogrepl.versions import Features

RESTART = "and restart PostgreSQL (the setting only changes on restart)"


@dataclass(frozen=True)
class Demand:
    """What the planned subscriptions need at most, during the initial table copy."""

    subscriptions: int
    sync_workers_per_subscription: int

    @property
    def per_subscription(self) -> int:
        """One for the apply side plus one per concurrent table-sync worker."""
        return 1 + self.sync_workers_per_subscription

    @property
    def total(self) -> int:
        """Slots (publisher), WAL senders (publisher) and workers (subscriber) needed."""
        return self.subscriptions * self.per_subscription

    def explain(self, unit: str) -> str:
        """``1 subscription x (1 apply + 4 table-sync) slots``."""
        return (
            f"{counted(self.subscriptions, 'planned subscription')} x (1 apply + "
            f"{self.sync_workers_per_subscription} table-sync) {unit}"
        )


def demand(inspection: Inspection) -> Demand:
    """The demand of ``inspection``'s planned subscriptions on its table set."""
    per_sub = inspection.subscriber.server.max_sync_workers_per_subscription
    return Demand(inspection.planned_subscriptions, min(per_sub, len(inspection.tables)))


def _shortage(
    *,
    check: Check,
    side: Side,
    setting: str,
    maximum: int,
    in_use: int,
    what_in_use: str,
    need: Demand,
    unit: str,
    extra_fix: str,
) -> Finding | None:
    free = maximum - in_use
    if free >= need.total:
        return None
    missing = need.total - max(free, 0)
    return Finding(
        check=check,
        severity=Severity.ERROR,
        side=side,
        message=(
            f"{setting} is {maximum} with {in_use} {what_in_use}, leaving {max(free, 0)} free; "
            f"{need.total} needed ({need.explain(unit)})."
        ),
        fix=(
            f"raise {setting} by {missing} to {maximum + missing} (ALTER SYSTEM SET {setting} = "
            f"{maximum + missing}) {RESTART}{extra_fix}"
        ),
    )


def check_publisher(inspection: Inspection) -> list[Finding]:
    """``wal_level``, replication slots and WAL senders on the publisher."""
    server = inspection.publisher.server
    findings: list[Finding] = []
    if server.wal_level != "logical":
        findings.append(
            Finding(
                Check.WAL_LEVEL,
                Severity.ERROR,
                Side.PUBLISHER,
                f"wal_level is {server.wal_level!r}; logical decoding needs 'logical'.",
                f"ALTER SYSTEM SET wal_level = 'logical' {RESTART}",
            )
        )
    if server.temp_file_limit is not None:
        findings.append(
            _temp_file_limit(server.temp_file_limit, server.largest_decoded_transaction)
        )
    if server.idle_replication_slot_timeout_s is not None:
        findings.append(
            Finding(
                Check.IDLE_SLOT_TIMEOUT,
                Severity.WARNING,
                Side.PUBLISHER,
                f"idle_replication_slot_timeout is {server.idle_replication_slot_timeout_s} s "
                f"(PostgreSQL 18): a slot nobody reads for longer is invalidated at the next "
                f"checkpoint, for good. A subscription's slot is read all the time; a drain's "
                f"slot is idle between runs, so a schedule slower than that loses it.",
                "schedule drains well within the timeout, or ALTER SYSTEM SET "
                "idle_replication_slot_timeout = 0 (off)",
            )
        )
    findings += _publisher_shortages(inspection)
    return findings


def _temp_file_limit(limit: int, largest: int | None) -> Finding:
    """A drain's peek spills to temporary files: a transaction above the limit stops it."""
    above = ": above it" if largest and largest >= limit else ""
    seen = (
        f" Slots here already decoded transactions of at least {largest} bytes "
        f"(pg_stat_replication_slots){above}."
        if largest
        else " No slot here decoded a transaction big enough to spill yet."
    )
    return Finding(
        Check.TEMP_FILE_LIMIT,
        Severity.WARNING,
        Side.PUBLISHER,
        f"temp_file_limit is {limit} bytes. A drain's peek holds each "
        f"window, and at least its biggest transaction, in a temporary file: one "
        f"transaction bigger than that stops the drain for good while WAL piles up "
        f"(subscriptions are not affected).{seen}",
        "ALTER ROLE <drain role> SET temp_file_limit = -1 (a superuser may), or keep "
        "it above the biggest transaction the application writes",
    )


def _publisher_shortages(inspection: Inspection) -> list[Finding]:
    """Replication slots and WAL senders short of what the planned subscriptions need."""
    server = inspection.publisher.server
    usage = inspection.publisher.publisher_usage or PublisherUsage(0, 0)
    need = demand(inspection)
    findings: list[Finding] = []
    for finding in (
        _shortage(
            check=Check.REPLICATION_SLOTS,
            side=Side.PUBLISHER,
            setting="max_replication_slots",
            maximum=server.max_replication_slots,
            in_use=usage.slots_in_use,
            what_in_use="slots existing (pg_replication_slots)",
            need=need,
            unit="slots",
            extra_fix="; or drop slots nothing consumes any more (they also retain WAL)",
        ),
        _shortage(
            check=Check.WAL_SENDERS,
            side=Side.PUBLISHER,
            setting="max_wal_senders",
            maximum=server.max_wal_senders,
            in_use=usage.wal_senders_in_use,
            what_in_use="WAL senders running (pg_stat_replication)",
            need=need,
            unit="WAL senders",
            extra_fix=(
                "; keep it at least max_replication_slots plus the number of physical standbys"
            ),
        ),
    ):
        if finding is not None:
            findings.append(finding)
    return findings


def check_subscriber(inspection: Inspection) -> list[Finding]:
    """Logical replication workers, worker processes and replication origins on the subscriber."""
    server = inspection.subscriber.server
    usage = inspection.subscriber.subscriber_usage or SubscriberUsage(0, 0, 0)
    need = demand(inspection)
    findings: list[Finding] = []
    # Raising the worker limit only helps if max_worker_processes stays above the new value.
    free = server.max_logical_replication_workers - usage.logical_workers_in_use
    target = server.max_logical_replication_workers + need.total - max(free, 0)
    processes_fix = (
        f"; max_worker_processes ({server.max_worker_processes}) must then be raised to at "
        f"least {target + 1}"
        if server.max_worker_processes < target + 1
        else ""
    )
    workers = _shortage(
        check=Check.LOGICAL_WORKERS,
        side=Side.SUBSCRIBER,
        setting="max_logical_replication_workers",
        maximum=server.max_logical_replication_workers,
        in_use=usage.logical_workers_in_use,
        what_in_use=(
            f"workers held by existing subscriptions ({usage.enabled_subscriptions} enabled, "
            f"{usage.extra_workers_running} sync/parallel workers running)"
        ),
        need=need,
        unit="workers",
        extra_fix=processes_fix,
    )
    if workers is not None:
        findings.append(workers)
    if server.max_worker_processes < server.max_logical_replication_workers + 1:
        target = server.max_logical_replication_workers + 1
        findings.append(
            Finding(
                Check.WORKER_PROCESSES,
                Severity.ERROR,
                Side.SUBSCRIBER,
                f"max_worker_processes is {server.max_worker_processes}, below "
                f"max_logical_replication_workers ({server.max_logical_replication_workers}) + 1 "
                f"for the logical replication launcher; replication workers cannot all start.",
                f"raise max_worker_processes by {target - server.max_worker_processes} to "
                f"{target} (ALTER SYSTEM SET max_worker_processes = {target}) {RESTART}; add "
                f"what parallel query and extensions use on top",
            )
        )
    # Replication origins, which each subscription and each table-sync worker hold, are capped
    # by the subscriber's max_replication_slots up to 17 and by their own setting from 18.
    setting = Features.of(server.version_num).origins_setting
    maximum = (
        server.max_replication_slots
        if setting == "max_replication_slots"
        else server.max_active_replication_origins
    )
    if maximum is not None:
        origins = _shortage(
            check=Check.REPLICATION_ORIGINS,
            side=Side.SUBSCRIBER,
            setting=setting,
            maximum=maximum,
            in_use=usage.origins_in_use,
            what_in_use="replication origins held by existing subscriptions and sync workers",
            need=need,
            unit="replication origins",
            extra_fix=" on the subscriber, where it limits replication origins",
        )
        if origins is not None:
            findings.append(origins)
    return findings


def capacity(inspection: Inspection) -> dict[str, dict[str, Any]]:
    """The numbers behind the capacity checks, for the report."""
    pub, sub = inspection.publisher.server, inspection.subscriber.server
    pub_usage = inspection.publisher.publisher_usage or PublisherUsage(0, 0)
    sub_usage = inspection.subscriber.subscriber_usage or SubscriberUsage(0, 0, 0)
    need = demand(inspection)
    return {
        "publisher": {
            "version": pub.version,
            "wal_level": pub.wal_level,
            "max_replication_slots": pub.max_replication_slots,
            "replication_slots_in_use": pub_usage.slots_in_use,
            "max_wal_senders": pub.max_wal_senders,
            "wal_senders_in_use": pub_usage.wal_senders_in_use,
            "needed": need.total,
        },
        "subscriber": {
            "version": sub.version,
            "max_logical_replication_workers": sub.max_logical_replication_workers,
            "logical_workers_in_use": sub_usage.logical_workers_in_use,
            "max_worker_processes": sub.max_worker_processes,
            "max_replication_slots": sub.max_replication_slots,
            "replication_origins_in_use": sub_usage.origins_in_use,
            "max_sync_workers_per_subscription": sub.max_sync_workers_per_subscription,
            "needed": need.total,
        },
    }
