"""Probes: what a sensor or trigger looks at, fetched sync (poke) or async (trigger).

A probe is a small serialisable description (connection ids, names, thresholds). ``verdict``
turns fetched facts into a ``Verdict`` with the pure rules in ``verdicts``; ``fetch`` and
``afetch`` get the same facts through the hook's sync and async methods.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import SlotInfo, SubscriptionStatus
from airflow_pglogrepl.models.verdicts import Verdict, reached, slot_lag, subscription_ready

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook


class WorkerlessClock:
    """How long a subscription has had no worker, across polls of one sensor or trigger.

    A missing worker for a moment is normal (the launcher restarts workers after an error, or
    has not started them yet); only an absence longer than the grace period is a verdict.
    """

    def __init__(self) -> None:
        self._since: float | None = None

    def observe(self, status: SubscriptionStatus) -> float:
        """Seconds without any worker, as of this poll (0 while a worker runs)."""
        import time

        now = time.monotonic()
        if status.workers == 0:
            self._since = self._since if self._since is not None else now
        else:
            self._since = None
        return now - self._since if self._since is not None else 0.0


@dataclass(frozen=True)
class ReadyProbe:
    """Every table of a subscription in state ``r`` (see ``verdicts.subscription_ready``)."""

    subscriber_conn_id: str
    subscription: str
    subscriber_database: str | None = None
    max_sync_errors: int = 3
    worker_grace_s: float = 60.0

    def kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fetch(self) -> SubscriptionStatus:
        return _hook(self.subscriber_conn_id, self.subscriber_database).subscription_status(
            self.subscription
        )

    async def afetch(self) -> SubscriptionStatus:
        hook = _hook(self.subscriber_conn_id, self.subscriber_database)
        return await hook.asubscription_status(self.subscription)

    def verdict(self, status: SubscriptionStatus, workerless_s: float) -> Verdict:
        return subscription_ready(
            status,
            max_sync_errors=self.max_sync_errors,
            workerless_s=workerless_s,
            worker_grace_s=self.worker_grace_s,
        )


@dataclass(frozen=True)
class ProgressProbe:
    """Slot lag on the publisher and/or a confirmed LSN reaching a target.

    With ``slot_name`` (publisher side): ``max_lag_bytes`` bounds the distance from the slot's
    ``confirmed_flush_lsn`` to the current WAL, and ``target_lsn`` (when no subscription is
    named) must be reached by ``confirmed_flush_lsn``. With ``subscription`` (subscriber side):
    ``target_lsn`` must be reached by ``pg_stat_subscription.latest_end_lsn``. All conditions
    given must hold.
    """

    publisher_conn_id: str | None = None
    slot_name: str | None = None
    publisher_database: str | None = None
    subscriber_conn_id: str | None = None
    subscription: str | None = None
    subscriber_database: str | None = None
    max_lag_bytes: int | None = None
    target_lsn: str | None = None

    def __post_init__(self) -> None:
        if self.slot_name and not self.publisher_conn_id:
            raise ValueError("slot_name needs publisher_conn_id")
        if self.subscription and not self.subscriber_conn_id:
            raise ValueError("subscription needs subscriber_conn_id")
        if not self.slot_name and not self.subscription:
            raise ValueError("name a slot (publisher side) or a subscription (subscriber side)")
        if self.max_lag_bytes is None and self.target_lsn is None:
            raise ValueError("give max_lag_bytes, target_lsn, or both")
        if self.max_lag_bytes is not None and not self.slot_name:
            raise ValueError("max_lag_bytes is measured on the publisher: name the slot")
        if self.target_lsn is not None:
            LSN(self.target_lsn)  # reject bad text at construction, naming it

    def kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fetch(self) -> tuple[SlotInfo | None, SubscriptionStatus | None]:
        slot = status = None
        if self.slot_name and self.publisher_conn_id:
            hook = _hook(self.publisher_conn_id, self.publisher_database)
            slot = next((s for s in hook.list_slots() if s.name == self.slot_name), None)
        if self.subscription and self.subscriber_conn_id:
            status = _hook(self.subscriber_conn_id, self.subscriber_database).subscription_status(
                self.subscription
            )
        return slot, status

    async def afetch(self) -> tuple[SlotInfo | None, SubscriptionStatus | None]:
        slot = status = None
        if self.slot_name and self.publisher_conn_id:
            hook = _hook(self.publisher_conn_id, self.publisher_database)
            slot = await hook.aget_slot(self.slot_name)
        if self.subscription and self.subscriber_conn_id:
            hook = _hook(self.subscriber_conn_id, self.subscriber_database)
            status = await hook.asubscription_status(self.subscription)
        return slot, status

    def verdict(self, slot: SlotInfo | None, status: SubscriptionStatus | None) -> Verdict:
        parts: list[Verdict] = []
        target = LSN(self.target_lsn) if self.target_lsn is not None else None
        if self.slot_name:
            if slot is None:
                return Verdict(
                    False,
                    f"replication slot {self.slot_name!r} does not exist on the publisher. Fix: "
                    f"check the slot name (a subscription's slot: pg_subscription.subslotname)",
                    failed=True,
                )
            if self.max_lag_bytes is not None:
                parts.append(slot_lag(slot, max_lag_bytes=self.max_lag_bytes))
            if target is not None and not self.subscription:
                parts.append(
                    reached(slot.confirmed_flush_lsn, target, what=f"slot {self.slot_name!r}")
                )
        if self.subscription:
            if status is None or not status.exists:
                return Verdict(
                    False,
                    f"subscription {self.subscription!r} does not exist on the subscriber",
                    failed=True,
                )
            if target is not None:
                parts.append(
                    reached(
                        status.latest_end_lsn,
                        target,
                        what=f"subscription {self.subscription!r} (latest_end_lsn)",
                    )
                )
        data: dict[str, Any] = {}
        for part in parts:
            data.update(part.data)
        return Verdict(
            done=all(p.done for p in parts),
            failed=any(p.failed for p in parts),
            message="; ".join(p.message for p in parts),
            data=data,
        )


def _hook(conn_id: str, database: str | None) -> PgLogicalReplicationHook:
    from airflow_pglogrepl.hooks.for_connection import replication_hook

    return replication_hook(conn_id, database)
