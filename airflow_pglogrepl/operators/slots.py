"""Create, drop and health-check logical replication slots."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl import metrics
from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook

if TYPE_CHECKING:
    from airflow_pglogrepl.models.failover import FailoverReadiness
    from airflow_pglogrepl.models.records import SlotInfo


class CreateReplicationSlotOperator(TaskBoundary, BaseOperator):
    """Create a logical slot; a no-op when it exists with the same plugin.

    Pushes ``{"slot", "plugin", "lsn", "created"}``: ``lsn`` is the consistent point for a new
    slot (changes committed after it are decoded), the confirmed position for an existing one.

    :param slot_name: slot name (``[a-z0-9_]``, at most 63 characters).
    :param postgres_conn_id: the publisher's Airflow connection.
    :param plugin: output plugin (``pgoutput`` or ``test_decoding``).
    :param two_phase: decode prepared transactions at PREPARE.
    :param failover: synchronize the slot to standbys, so a promotion keeps it (PostgreSQL 17+;
        docs/high-availability.md). Default: a new slot is one wherever the server can (a 17+
        primary), an existing one is left as it is; ``True`` also makes an existing slot one
        (``SlotInUseError``, retried, while a consumer holds it), and fails where the server
        cannot; ``False``: a new slot is not one.
    :param database: the database the slot belongs to, when not the connection's.
    """

    template_fields: Sequence[str] = ("slot_name", "postgres_conn_id", "database")

    def __init__(
        self,
        *,
        slot_name: str,
        postgres_conn_id: str,
        plugin: str = "pgoutput",
        two_phase: bool = False,
        failover: bool | None = None,
        database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.postgres_conn_id = postgres_conn_id
        self.plugin = plugin
        self.two_phase = two_phase
        self.failover = failover
        self.database = database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import SlotNotFoundError

        hook = replication_hook(self.postgres_conn_id, self.database)
        try:
            slot = hook.get_slot(self.slot_name, plugin=self.plugin)  # WrongPluginError if not
        except SlotNotFoundError:
            created = hook.create_logical_slot(
                self.slot_name, plugin=self.plugin, two_phase=self.two_phase,
                failover=self.failover,
            )  # fmt: skip
            return {"slot": created.name, "plugin": created.plugin, "created": True,
                    "lsn": str(created.lsn), "failover": created.failover}  # fmt: skip
        failover = bool(slot.failover) or self._make_failover(hook, slot.failover)
        self.log.info("Slot %s exists (plugin %s%s); nothing else to do", self.slot_name,
                      slot.plugin, ", failover" if failover else "")  # fmt: skip
        return {"slot": self.slot_name, "plugin": slot.plugin, "created": False,
                "lsn": str(slot.confirmed_flush_lsn), "failover": failover}  # fmt: skip

    def _make_failover(self, hook: Any, now: bool | None) -> bool:
        """Make the existing slot a failover slot when asked (``failover=True``); True when it
        is one now. Not by default: a failover slot's readers wait for the standbys
        ``synchronized_standby_slots`` names, which an existing drain did not before."""
        from airflow_pglogrepl.conninfo import describe
        from airflow_pglogrepl.models.failover import wants_failover

        if not self.failover:
            if self.failover is None and now is False:
                self.log.info(
                    "Slot %s is not a failover slot: a promotion of a standby loses it. "
                    "failover=True makes it one (docs/high-availability.md)", self.slot_name,
                )  # fmt: skip
            return False
        facts = hook.server_facts()
        server = describe(hook.connection_params())
        wants_failover(self.slot_name, server, facts.version_num,
                       in_hot_standby=facts.in_recovery, requested=True)  # fmt: skip
        hook.make_failover_slot(self.slot_name)  # SlotInUseError while a consumer holds it
        self.log.info("Slot %s was made a failover slot (synchronized to standbys)", self.slot_name)
        return True


class DropReplicationSlotOperator(TaskBoundary, BaseOperator):
    """Drop a slot so it stops retaining WAL; succeeds when it is already gone.

    :param slot_name: slot name.
    :param postgres_conn_id: the publisher's Airflow connection.
    :param database: the database of the slot, when not the connection's.
    """

    template_fields: Sequence[str] = ("slot_name", "postgres_conn_id", "database")

    def __init__(
        self,
        *,
        slot_name: str,
        postgres_conn_id: str,
        database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.postgres_conn_id = postgres_conn_id
        self.database = database

    def execute(self, context: Context) -> dict[str, Any]:
        hook = replication_hook(self.postgres_conn_id, self.database)
        dropped = hook.drop_slot(self.slot_name, missing_ok=True)
        return {"slot": self.slot_name, "dropped": dropped}


class SlotHealthCheckOperator(TaskBoundary, BaseOperator):
    """Fail loudly when a slot is unusable or endangers the publisher's disk.

    Checks: ``wal_status`` ``lost`` (unusable) or ``unreserved`` (about to be), retained WAL
    above ``max_retained_bytes`` or above ``max_retained_fraction`` of ``max_slot_wal_keep_size``,
    inactive longer than ``max_inactive``, ``temp_file_limit`` below the size of transactions
    the slot decoded (``pg_stat_replication_slots``: a drain's peek holds whole transactions in
    a temporary file, and fails for ever on one bigger than the limit), and optionally the
    plugin and whether another session holds it. The slot record is pushed to XCom
    (``return_value``) either way, with ``problems`` listing what failed.

    On PostgreSQL 18 a slot inactive for half of ``idle_replication_slot_timeout`` fails the
    check too: the server invalidates it at the first checkpoint past the timeout. A lost slot
    is reported with the server's ``invalidation_reason`` (17+) and what prevents it.

    Inactivity: PostgreSQL 17 reports ``inactive_since``; on older servers the task carries the
    moment it first saw the slot inactive forward from its previous run's XCom.

    :param slot_name: slot name.
    :param postgres_conn_id: the publisher's Airflow connection.
    :param max_retained_bytes: fail above this many bytes of retained WAL.
    :param max_retained_fraction: fail above this fraction of ``max_slot_wal_keep_size``.
    :param max_inactive: fail when inactive longer than this.
    :param plugin: fail unless the slot uses this output plugin.
    :param allow_active: when False, fail if another session is consuming the slot.
    :param active_grace_seconds: with ``allow_active`` False, how long an active slot is given to
        be let go before that counts: a session that holds it for a moment (the peek of the
        slot's event trigger, ``SlotChangesTrigger``) is not its consumer. 0: none.
    :param standby_conn_ids: the primary's standbys: with them, the check also fails unless a
        promotion of one keeps the slot (``models.failover``: a failover slot, a ready
        synchronized copy on the standby, ``synchronized_standby_slots`` on the primary; 17+).
        The verdict is pushed as ``failover``, and sent as metrics.
    :param database: the database of the slot, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "slot_name", "postgres_conn_id", "database", "standby_conn_ids",
    )  # fmt: skip

    def __init__(
        self,
        *,
        slot_name: str,
        postgres_conn_id: str,
        max_retained_bytes: int | None = None,
        max_retained_fraction: float | None = None,
        max_inactive: dt.timedelta | None = None,
        plugin: str | None = None,
        allow_active: bool = True,
        active_grace_seconds: float = 10.0,
        standby_conn_ids: Sequence[str] = (),
        database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.postgres_conn_id = postgres_conn_id
        self.standby_conn_ids = standby_conn_ids
        self.max_retained_bytes = max_retained_bytes
        self.max_retained_fraction = max_retained_fraction
        self.max_inactive = max_inactive
        self.plugin = plugin
        self.allow_active = allow_active
        self.active_grace_seconds = active_grace_seconds
        self.database = database

    def _let_go(self, hook: Any, slot: SlotInfo) -> SlotInfo:
        """The slot once a session holding it for a moment has let go (up to
        ``active_grace_seconds``), when an active slot would fail the check."""
        import time

        grace = float(self.active_grace_seconds or 0)
        if self.allow_active or not slot.active or grace <= 0:
            return slot
        self.log.info("slot %s is active (PID %s): waiting up to %.0f s for a session that holds "
                      "it for a moment (a trigger's peek) to let go", slot.name, slot.active_pid,
                      grace)  # fmt: skip
        deadline = time.monotonic() + grace
        while slot.active and time.monotonic() < deadline:
            time.sleep(0.2)
            slot = hook.get_slot(self.slot_name)
        return slot

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import SlotUnhealthyError
        from airflow_pglogrepl.models.verdicts import HealthPolicy, slot_health

        hook = replication_hook(self.postgres_conn_id, self.database)
        slot = self._let_go(hook, hook.get_slot(self.slot_name))
        metrics.slot(slot)
        facts = hook.server_facts()
        now = dt.datetime.now(dt.UTC)
        inactive_since = slot.inactive_since or self._first_seen_inactive(context, slot.active, now)
        # whose clock the inactivity is: the server's own (17+), or this task's runs
        inactive_source = (
            "server: pg_replication_slots.inactive_since"
            if slot.inactive_since is not None
            else "this task: first run that saw it inactive (XCom)"
            if inactive_since is not None
            else None
        )
        policy = HealthPolicy(
            plugin=self.plugin,
            max_retained_bytes=self.max_retained_bytes,
            max_retained_fraction=self.max_retained_fraction,
            max_inactive=self.max_inactive,
            allow_active=self.allow_active,
        )
        spill = hook.slot_spill(slot.name)
        problems = slot_health(
            slot,
            policy,
            max_slot_wal_keep_size=facts.max_slot_wal_keep_size,
            inactive_since=inactive_since,
            now=now,
            temp_file_limit=facts.temp_file_limit,
            spill=spill,
            idle_timeout_s=facts.idle_replication_slot_timeout_s,
            in_recovery=facts.in_recovery,
        )
        record = {
            **slot.to_dict(),
            "observed_inactive_since": inactive_since.isoformat() if inactive_since else None,
            "inactive_since_source": inactive_source,
            "temp_file_limit": facts.temp_file_limit,
            "idle_replication_slot_timeout_s": facts.idle_replication_slot_timeout_s,
            "decoding": spill.to_dict() if spill is not None else None,
            "problems": problems,
        }
        if self.standby_conn_ids:
            readiness = self._failover(hook)
            metrics.failover(slot.name, ready=readiness.ready,
                             standby_lag_bytes=readiness.standby_lag_bytes)  # fmt: skip
            record["failover"] = readiness.to_dict()
            problems += readiness.problems
        self.log.info(
            "Slot %s: wal_status=%s retained=%s bytes active=%s confirmed_flush_lsn=%s",
            slot.name, slot.wal_status, slot.retained_bytes, slot.active,
            slot.confirmed_flush_lsn,
        )  # fmt: skip
        if problems:
            context["ti"].xcom_push(key="return_value", value=record)
            raise SlotUnhealthyError(problems)
        return record

    def _failover(self, hook: Any) -> FailoverReadiness:
        """``models.failover.failover_readiness`` of the slot over the standbys; a standby
        that cannot be reached is a problem of its own, not a failed check."""
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_pglogrepl.exceptions import ConnectionFailedError
        from airflow_pglogrepl.models.failover import failover_readiness

        standbys, unreachable = [], []
        for conn_id in self.standby_conn_ids:
            try:
                standby = replication_hook(conn_id, self.database)
                standbys.append(standby.failover_standby(self.slot_name))
            except ConnectionFailedError as exc:  # (its text has no password)
                unreachable.append(f"standby {conn_id!r} could not be checked: {exc}")
            except AirflowNotFoundException:
                unreachable.append(
                    f"standby {conn_id!r} could not be checked: no Airflow connection has "
                    f"that id. Fix: check standby_conn_ids"
                )
        return failover_readiness(hook.failover_primary(self.slot_name), standbys, unreachable)

    def _first_seen_inactive(
        self, context: Context, active: bool, now: dt.datetime
    ) -> dt.datetime | None:
        if active:
            return None
        previous = context["ti"].xcom_pull(task_ids=self.task_id, include_prior_dates=True)
        seen = previous.get("observed_inactive_since") if isinstance(previous, dict) else None
        return dt.datetime.fromisoformat(seen) if seen else now
