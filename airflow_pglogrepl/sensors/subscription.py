"""``SubscriptionReadySensor``: wait until every table of a subscription is in state ``r``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_pglogrepl import metrics
from airflow_pglogrepl.models.verdicts import Verdict
from airflow_pglogrepl.sensors._base import VerdictSensor
from airflow_pglogrepl.triggers.probes import ReadyProbe, WorkerlessClock


class SubscriptionReadySensor(VerdictSensor):
    """Succeed when every relation in ``pg_subscription_rel`` is ready (``r``).

    Each poke logs the per-state counts (initialize, copying data, finished copy,
    synchronized, ready) and pushes them to XCom (``observed``). Fails fast, instead of timing
    out, when the subscription does not exist, is disabled, has had ``max_sync_errors`` table
    sync failures (``pg_stat_subscription_stats``, PostgreSQL 15+), or has had no worker for
    ``worker_grace_period`` seconds while tables are not ready.

    :param subscription: subscription name.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param subscriber_database: subscriber database, when not the connection's.
    :param max_sync_errors: fail once this many table-sync errors were counted.
    :param worker_grace_period: seconds without any worker before the subscription is stuck.
    :param deferrable: wait in the triggerer instead of a worker slot.
    """

    template_fields: Sequence[str] = ("subscription", "subscriber_conn_id", "subscriber_database")

    def __init__(
        self,
        *,
        subscription: str,
        subscriber_conn_id: str,
        subscriber_database: str | None = None,
        max_sync_errors: int = 3,
        worker_grace_period: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.subscriber_database = subscriber_database
        self.max_sync_errors = max_sync_errors
        self.worker_grace_period = worker_grace_period
        self._workerless = WorkerlessClock()

    def _probe(self) -> ReadyProbe:
        return ReadyProbe(
            subscriber_conn_id=self.subscriber_conn_id,
            subscription=self.subscription,
            subscriber_database=self.subscriber_database,
            max_sync_errors=self.max_sync_errors,
            worker_grace_s=self.worker_grace_period,
        )

    def verdict(self) -> Verdict:
        probe = self._probe()
        status = probe.fetch()
        if status.exists:
            metrics.subscription(str(self.subscription), tables_not_ready=len(status.not_ready),
                                 apply_errors=status.apply_error_count)  # fmt: skip
        return probe.verdict(status, self._workerless.observe(status))

    def trigger(self) -> Any:
        from airflow_pglogrepl.triggers.replication import SubscriptionReadyTrigger

        return SubscriptionReadyTrigger(poll_interval=self.poke_interval, **self._probe().kwargs())
