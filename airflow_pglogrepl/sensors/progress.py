"""``ReplicationLagSensor`` and ``LsnCatchUpSensor``: wait for replication to catch up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_pglogrepl.models.verdicts import Verdict
from airflow_pglogrepl.sensors._base import VerdictSensor
from airflow_pglogrepl.triggers.probes import ProgressProbe


class _ProgressSensor(VerdictSensor):
    template_fields: Sequence[str] = (
        "slot_name", "subscription", "target_lsn", "publisher_conn_id", "subscriber_conn_id",
        "publisher_database", "subscriber_database", "max_lag_bytes",
    )  # fmt: skip

    def __init__(
        self,
        *,
        publisher_conn_id: str | None = None,
        slot_name: str | None = None,
        publisher_database: str | None = None,
        subscriber_conn_id: str | None = None,
        subscription: str | None = None,
        subscriber_database: str | None = None,
        max_lag_bytes: int | None = None,
        target_lsn: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.publisher_conn_id = publisher_conn_id
        self.slot_name = slot_name
        self.publisher_database = publisher_database
        self.subscriber_conn_id = subscriber_conn_id
        self.subscription = subscription
        self.subscriber_database = subscriber_database
        self.max_lag_bytes = max_lag_bytes
        self.target_lsn = target_lsn

    def _probe(self) -> ProgressProbe:
        target = str(self.target_lsn).strip() if self.target_lsn else None
        return ProgressProbe(
            publisher_conn_id=self.publisher_conn_id,
            slot_name=self.slot_name,
            publisher_database=self.publisher_database,
            subscriber_conn_id=self.subscriber_conn_id,
            subscription=self.subscription,
            subscriber_database=self.subscriber_database,
            max_lag_bytes=self.max_lag_bytes,
            target_lsn=target,
        )

    def verdict(self) -> Verdict:
        probe = self._probe()
        return probe.verdict(*probe.fetch())

    def trigger(self) -> Any:
        from airflow_pglogrepl.triggers.replication import ReplicationProgressTrigger

        return ReplicationProgressTrigger(
            poll_interval=self.poke_interval, **self._probe().kwargs()
        )


class ReplicationLagSensor(_ProgressSensor):
    """Succeed when replication is close enough: slot lag and/or a subscriber-side target.

    Publisher side: the slot's ``confirmed_flush_lsn`` at most ``max_lag_bytes`` behind the
    publisher's current WAL (``slot_name``, or the slot of ``subscription`` looked up on the
    subscriber). Subscriber side: ``pg_stat_subscription.latest_end_lsn`` at or past
    ``target_lsn``. Pushes the lag bytes and LSNs seen to XCom (``observed``).

    :param max_lag_bytes: largest acceptable distance in bytes (publisher side).
    :param publisher_conn_id: Airflow connection of the publisher.
    :param slot_name: the slot to measure (default: the subscription's slot).
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param subscription: subscription name (its slot, and its latest_end_lsn).
    :param target_lsn: an LSN the subscriber must have reached (templated).
    :param deferrable: wait in the triggerer instead of a worker slot.
    """

    def _probe(self) -> ProgressProbe:
        if self.slot_name is None and self.subscription and self.publisher_conn_id:
            self.slot_name = self._subscription_slot()
        probe = super()._probe()
        if self.max_lag_bytes is not None and self.target_lsn is None and probe.subscription:
            # The subscription only named the slot: measure on the publisher alone.
            probe = ProgressProbe(**{**probe.kwargs(), "subscription": None})
        return probe

    def _subscription_slot(self) -> str:
        from airflow_pglogrepl.exceptions import ObjectNotFoundError
        from airflow_pglogrepl.hooks.for_connection import replication_hook

        assert self.subscriber_conn_id and self.subscription
        info = replication_hook(self.subscriber_conn_id, self.subscriber_database).get_subscription(
            self.subscription
        )
        if info is None or info.slot_name is None:
            raise ObjectNotFoundError(
                "subscription",
                self.subscription,
                "create it (with a slot) before measuring its lag, or pass slot_name",
            )
        return info.slot_name


class LsnCatchUpSensor(_ProgressSensor):
    """Succeed when a slot or a subscription has confirmed a given LSN (the cutover fence).

    ``target_lsn`` is templated, typically from the fence task's XCom:
    ``"{{ ti.xcom_pull(task_ids='write_fence', key='fence_lsn') }}"``. Publisher side: the
    slot's ``confirmed_flush_lsn``; subscriber side: ``pg_stat_subscription.latest_end_lsn``.

    :param target_lsn: the LSN to reach (text such as ``0/16B3748``).
    :param publisher_conn_id: with ``slot_name``: watch the slot on the publisher.
    :param subscriber_conn_id: with ``subscription``: watch the subscriber's progress.
    :param deferrable: wait in the triggerer instead of a worker slot.
    """

    def __init__(self, *, target_lsn: str, **kwargs: Any) -> None:
        super().__init__(target_lsn=target_lsn, **kwargs)
