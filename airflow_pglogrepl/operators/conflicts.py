"""Apply conflicts on the subscriber: surface them with the failing relation, skip one on request.

A change that violates a constraint on the subscriber (a duplicate key planted there, a missing
column) stops the apply worker; it restarts every ``wal_retrieve_retry_interval`` and fails again
on the same transaction until someone acts. The error text is only in the subscriber's server
log, for example::

    ERROR:  duplicate key value violates unique constraint "orders_pkey"
    CONTEXT:  processing remote data for replication origin "pg_16395" during message type
              "INSERT" for replication target relation "public.orders" in transaction 731,
              finished at 0/1565D30

Over SQL the subscriber shows the error counters (``pg_stat_subscription_stats``), the missing
worker (``pg_stat_subscription``), tables stuck in sync (``pg_subscription_rel``) and a pending
skip (``subskiplsn``). Given the publisher's connection, the check also peeks the subscription's
slot there for the transaction the worker is stuck on: its tables and its finish LSN.
Skipping a transaction loses all of its changes, so ``SkipConflictingTransactionOperator`` never
guesses the LSN: it must be given, checked against the ``finished at`` of that log line.
See https://www.postgresql.org/docs/15/logical-replication-conflicts.html
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.models.records import SubscriptionErrors
    from airflow_pglogrepl.pgoutput.pending import PendingTransaction

# What each PostgreSQL 18 conflict counter means for a move: the apply worker stops on the
# *_exists ones (they are apply errors too) and resolves the others by itself, silently.
CONFLICT_MEANINGS = {
    "insert_exists": "an inserted row's key already exists on the subscriber (the worker stops)",
    "update_exists": "an updated row's new key already exists on the subscriber (the worker stops)",
    "multiple_unique_conflicts": "a change hit several unique keys on the subscriber "
    "(the worker stops)",
    "update_missing": "the publisher updated rows the subscriber does not have; the updates were "
    "skipped, so the subscriber has diverged",
    "delete_missing": "the publisher deleted rows the subscriber does not have (skipped)",
    "update_origin_differs": "rows last changed on the subscriber by another origin were "
    "overwritten (something else writes there)",
    "delete_origin_differs": "rows last changed on the subscriber by another origin were deleted "
    "(something else writes there)",
}

LOG_HINT = (
    "The subscriber's server log has the error; its CONTEXT line ends with "
    "'... in transaction <xid>, finished at <LSN>'"
)


def subscription_problems(
    errors: SubscriptionErrors,
    *,
    max_apply_errors: int,
    max_sync_errors: int,
    worker_seen: bool,
    fail_if_disabled: bool,
    max_conflicts: Mapping[str, int] | None = None,
) -> list[str]:
    """What is wrong with the subscription's apply and table sync, one sentence each.

    ``worker_seen``: an apply worker was running at some point while the check looked.
    ``max_conflicts``: conflicts tolerated per kind (PostgreSQL 18 counts them; none by
    default). Pure.
    """
    max_conflicts = max_conflicts or {}
    name = errors.name
    if not errors.exists:
        return [f"subscription {name!r} does not exist on the subscriber"]
    problems: list[str] = []
    apply_errors = errors.apply_error_count or 0
    sync_errors = errors.sync_error_count or 0
    since = f" since {errors.stats_reset.isoformat()}" if errors.stats_reset else ""
    if apply_errors > max_apply_errors:
        problems.append(
            f"{apply_errors} apply error(s){since} (pg_stat_subscription_stats.apply_error_count,"
            f" allowed {max_apply_errors})"
        )
    if sync_errors > max_sync_errors:
        stuck = ", ".join(f"{rel.table} (state {rel.state})" for rel in errors.not_ready)
        problems.append(
            f"{sync_errors} table sync error(s){since} (sync_error_count, allowed "
            f"{max_sync_errors})" + (f"; tables not ready: {stuck}" if stuck else "")
        )
    problems += conflict_problems(errors, max_conflicts)
    if errors.enabled and not worker_seen:
        problems.append("subscription is enabled but its apply worker is not running")
    if not errors.enabled and fail_if_disabled:
        problems.append("subscription is disabled (by hand, or by disable_on_error after an error)")
    if errors.skip_lsn is not None:
        problems.append(
            f"a skip of the transaction finishing at {errors.skip_lsn} is pending (subskiplsn): "
            f"the worker has not reached it yet"
        )
    return problems


def conflict_problems(errors: SubscriptionErrors, max_conflicts: Mapping[str, int]) -> list[str]:
    """The conflict counters (PostgreSQL 18) above what is tolerated, one sentence each."""
    since = f" since {errors.stats_reset.isoformat()}" if errors.stats_reset else ""
    return [
        f"{count} {kind} conflict(s){since} (pg_stat_subscription_stats.confl_{kind}, "
        f"PostgreSQL 18): {CONFLICT_MEANINGS.get(kind, 'see the subscriber log')}"
        for kind, count in sorted((errors.conflicts or {}).items())
        if count > max_conflicts.get(kind, 0)
    ]


def describe_pending(pending: PendingTransaction) -> str:
    """One sentence naming the stuck transaction's tables and finish LSN."""
    changes = ", ".join(f"{table} ({count} {kind})" for table, kind, count in pending.changes)
    return (
        f"the first transaction not applied (xid {pending.xid} on the publisher, finish LSN "
        f"{pending.finish_lsn}{'' if pending.complete else ', read in part'}) changes "
        f"{changes or 'nothing the subscription receives'}"
    )


def parse_skip_lsn(value: object) -> LSN:
    """The LSN to skip, refusing anything that is not an explicit, valid, non-zero LSN."""
    from airflow_pglogrepl.lsn import LSN

    if value is None or not str(value).strip() or str(value).strip().lower() == "none":
        raise ValueError(
            "SkipConflictingTransactionOperator needs the failing transaction's finish LSN "
            f"explicitly (lsn='0/1565D30'). {LOG_HINT}; copy that LSN. It is never guessed: "
            "skipping drops every change of the transaction"
        )
    lsn = LSN(str(value).strip())
    if int(lsn) == 0:
        raise ValueError("lsn 0/0 is not a transaction's finish LSN; " + LOG_HINT)
    return lsn


class SubscriptionErrorCheckOperator(TaskBoundary, BaseOperator):
    """Fail, naming the failing relation, when a subscription has apply or sync errors.

    Checks on the subscriber: ``apply_error_count`` and ``sync_error_count`` of
    ``pg_stat_subscription_stats`` (PostgreSQL 15+; cumulative since ``stats_reset``, which
    ``SkipConflictingTransactionOperator`` resets), an enabled subscription without its apply
    worker for ``worker_grace_period`` seconds (the launcher restarts a failed worker every
    ``wal_retrieve_retry_interval``, 5 s by default), a disabled subscription, a pending skip.
    Tables stuck in table sync are named from ``pg_subscription_rel``. With
    ``publisher_conn_id``, the apply error's relations come from the subscription's slot on the
    publisher: the first transaction the subscriber has not applied, with its tables, change
    counts and finish LSN (peeked, never consumed). The finish LSN must still be confirmed in
    the subscriber's log (``... finished at <LSN>``) and given to the skip operator explicitly.
    The report goes to XCom either way.

    :param subscription: subscription name.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param publisher_conn_id: the publisher's connection, to name the stuck transaction's tables.
    :param max_apply_errors: apply errors tolerated.
    :param max_sync_errors: table sync errors tolerated.
    :param max_conflicts: conflicts tolerated per kind (``{"delete_missing": 10}``); PostgreSQL
        18 counts them (``confl_*``), and by default any conflict fails: some the worker
        resolves silently (an update of a row the subscriber lacks is skipped), so the
        subscriber may have diverged without an error. Older servers do not count them.
    :param worker_grace_period: seconds an enabled subscription may be seen without a worker.
    :param fail_if_disabled: a disabled subscription fails the check.
    :param subscriber_database: subscriber database, when not the connection's.
    :param publisher_database: publisher database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "subscription", "subscriber_conn_id", "publisher_conn_id", "subscriber_database",
        "publisher_database",
    )  # fmt: skip
    ui_color = "#fcf3cf"

    def __init__(
        self,
        *,
        subscription: str,
        subscriber_conn_id: str,
        publisher_conn_id: str | None = None,
        max_apply_errors: int = 0,
        max_sync_errors: int = 0,
        max_conflicts: dict[str, int] | None = None,
        worker_grace_period: float = 15.0,
        fail_if_disabled: bool = True,
        subscriber_database: str | None = None,
        publisher_database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.publisher_conn_id = publisher_conn_id
        self.max_apply_errors = max_apply_errors
        self.max_sync_errors = max_sync_errors
        self.max_conflicts = dict(max_conflicts or {})
        self.worker_grace_period = worker_grace_period
        self.fail_if_disabled = fail_if_disabled
        self.subscriber_database = subscriber_database
        self.publisher_database = publisher_database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import SubscriptionErrorsError

        hook = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        errors = hook.subscription_errors(self.subscription)
        worker_seen = errors.apply_worker_pid is not None
        deadline = time.monotonic() + max(0.0, float(self.worker_grace_period))
        failing = (errors.apply_error_count or 0) > self.max_apply_errors
        while errors.exists and errors.enabled and not worker_seen and not failing:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
            errors = hook.subscription_errors(self.subscription)
            worker_seen = errors.apply_worker_pid is not None
            failing = (errors.apply_error_count or 0) > self.max_apply_errors
        problems = subscription_problems(
            errors,
            max_apply_errors=self.max_apply_errors,
            max_sync_errors=self.max_sync_errors,
            max_conflicts=self.max_conflicts,
            worker_seen=worker_seen,
            fail_if_disabled=self.fail_if_disabled,
        )
        conflicts = conflict_problems(errors, self.max_conflicts)
        # Counted conflicts alone stop nothing: there is no stuck transaction to look up.
        blocking = [p for p in problems if p not in conflicts]
        pending: PendingTransaction | None = None
        pending_error: str | None = None
        if blocking and errors.exists and errors.slot_name and self.publisher_conn_id:
            pending, pending_error = self._pending(errors)
        report = {
            **errors.to_dict(),
            "problems": problems,
            "pending_transaction": pending.to_dict() if pending else None,
            "pending_transaction_error": pending_error,
            "relations_involved": sorted(
                {str(t) for t in (pending.tables if pending else ())}
                | {str(rel.table) for rel in errors.not_ready}
            ),
        }
        if not problems:
            self.log.info(
                "Subscription %s: no apply or sync errors, worker running", self.subscription
            )
            return report
        lines = [f"subscription {self.subscription!r}: {p}" for p in problems]
        if pending is not None:
            lines.append(describe_pending(pending))
        elif pending_error:
            lines.append(
                f"could not read the stuck transaction from the publisher: {pending_error}"
            )
        if blocking:
            lines.append(
                f"{LOG_HINT}. Fix the conflicting rows on the subscriber (the worker then "
                f"retries by itself), or skip that whole transaction with "
                f"SkipConflictingTransactionOperator(subscription={self.subscription!r}, "
                f"lsn='<finish LSN from the log>')"
            )
        if conflicts:
            lines.append(
                "The subscriber's log names each conflict's table and key. Make the rows agree "
                "(the parity check finds them), then reset the counters, which only grow: "
                "pg_stat_reset_subscription_stats for this subscription "
                "(PgLogicalReplicationHook.reset_subscription_error_stats), or tolerate them "
                "with max_conflicts"
            )
        context["ti"].xcom_push(key="return_value", value=report)
        raise SubscriptionErrorsError(lines)

    def _pending(self, errors: SubscriptionErrors) -> tuple[PendingTransaction | None, str | None]:
        from airflow_pglogrepl.exceptions import PgLogReplError, SlotInUseError

        assert self.publisher_conn_id and errors.slot_name
        publisher = replication_hook(self.publisher_conn_id, self.publisher_database)
        # The worker holds the slot while it runs; between its retries the slot is free.
        deadline = time.monotonic() + 15.0
        while True:
            try:
                pending = publisher.pending_transaction(
                    errors.slot_name, errors.publications, applied_upto=errors.origin_lsn
                )
                return pending, None if pending else "no unapplied transaction in the slot"
            except SlotInUseError as exc:
                if time.monotonic() >= deadline:
                    return None, str(exc)
                time.sleep(0.5)
            except PgLogReplError as exc:
                return None, str(exc)


class SkipConflictingTransactionOperator(TaskBoundary, BaseOperator):
    """Skip the one remote transaction the subscriber cannot apply, given its finish LSN.

    PostgreSQL 15+: ``ALTER SUBSCRIPTION ... SKIP (lsn = ...)``; the apply worker drops every
    change of the transaction finishing exactly at ``lsn`` and clears ``subskiplsn``. Older
    servers: the subscription's replication origin is advanced to ``lsn`` (with the
    subscription disabled meanwhile). ``lsn`` is required and never guessed: it is the
    ``finished at <LSN>`` of the error's CONTEXT line in the subscriber's server log. The task
    waits up to ``wait_timeout`` seconds for the worker to skip (PostgreSQL 15+); if it never
    does, the skip is withdrawn and the task fails: the LSN was not that transaction's. Then the
    error counters are reset (``reset_error_stats``), so ``SubscriptionErrorCheckOperator``
    passes again unless a new error comes.

    :param subscription: subscription name.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param lsn: finish LSN of the failing transaction (templated), for example ``0/1565D30``.
    :param reset_error_stats: reset ``pg_stat_subscription_stats`` of the subscription.
    :param wait_timeout: seconds to wait for the worker to skip (0: do not wait).
    :param subscriber_database: subscriber database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "subscription", "lsn", "subscriber_conn_id", "subscriber_database",
    )  # fmt: skip
    ui_color = "#fadbd8"

    def __init__(
        self,
        *,
        subscription: str,
        subscriber_conn_id: str,
        lsn: str,
        reset_error_stats: bool = True,
        wait_timeout: float = 60.0,
        subscriber_database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if "{{" not in str(lsn):
            parse_skip_lsn(lsn)  # refuse a missing or invalid LSN when the DAG is parsed
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.lsn = lsn
        self.reset_error_stats = reset_error_stats
        self.wait_timeout = wait_timeout
        self.subscriber_database = subscriber_database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import ReplicationFailedError

        lsn = parse_skip_lsn(self.lsn)
        hook = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        method = hook.skip_transaction(self.subscription, lsn)
        result: dict[str, Any] = {"subscription": self.subscription, "lsn": str(lsn),
                                  "method": method, "skipped": None}  # fmt: skip
        if method == "skip" and self.wait_timeout > 0:
            errors = self._wait_for_skip(hook)
            if errors.skip_lsn is not None:
                hook.clear_skip(self.subscription)
                raise ReplicationFailedError(
                    f"subscription {self.subscription!r}: the apply worker did not skip a "
                    f"transaction finishing at {lsn} within {self.wait_timeout:.0f}s, so the skip "
                    f"was withdrawn. The LSN must be exactly the failing transaction's finish "
                    f"LSN: {LOG_HINT}"
                )
            result["skipped"] = True
        if self.reset_error_stats:
            # After the skip took effect: an error raised before it must not survive the reset.
            hook.reset_subscription_error_stats(self.subscription)
        return result

    def _wait_for_skip(self, hook: PgLogicalReplicationHook) -> SubscriptionErrors:
        deadline = time.monotonic() + float(self.wait_timeout)
        interval = 0.2
        while True:
            errors = hook.subscription_errors(self.subscription)
            if errors.skip_lsn is None or time.monotonic() >= deadline:
                return errors
            time.sleep(interval)
            interval = min(interval * 1.5, 2.0)
