"""``ReplicationPreflightOperator``: can this table set replicate from publisher to subscriber?

It reads both servers' catalogs through the hook, judges them with the pure rules of
``airflow_pglogrepl.preflight``, optionally fixes replica identities, and fails with one summary
listing every problem. The report goes to XCom (key ``report``) whether the check passes or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.models.facts import Inspection, SideFacts
from airflow_pglogrepl.preflight import (
    FixMode,
    PreflightFailedError,
    PreflightReport,
    ReplicaIdentityChangeError,
    evaluate,
)
from airflow_pglogrepl.preflight.checks import fix_failed
from airflow_pglogrepl.preflight.identity import assess, plan_fix
from airflow_pglogrepl.preflight.report import AppliedFix, Finding
from airflow_pglogrepl.tables import TableRef, parse_tables

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_pglogrepl.hooks.base import Conn
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook


class ReplicationPreflightOperator(TaskBoundary, BaseOperator):
    """Check that a table set can replicate; fail with every problem named, table by table.

    Publisher: ``wal_level``, free replication slots and WAL senders for the planned
    subscriptions and their table-sync workers, the connecting role's REPLICATION attribute and
    SELECT privilege, table kinds, and each table's replica identity. Subscriber: free logical
    replication workers, ``max_worker_processes``, and each table's presence, columns and key.

    The report (``PreflightReport.to_dict()``) is pushed to XCom under ``report`` in every case
    and is also the return value when the check passes. Keys: ``ok``, ``publication``,
    ``planned_subscriptions``, ``tables``, ``problems``, ``warnings``, ``capacity``,
    ``fixes_applied``, ``summary``.

    :param publisher_conn_id: Airflow connection of the publisher's database, as the role the
        subscriptions will connect as (its privileges are what is checked).
    :param subscriber_conn_id: Airflow connection of the subscriber's database.
    :param publication: a publication whose tables to check. It may not exist yet, if ``tables``
        names what it will publish; when both are given, their union is checked.
    :param tables: table names (``schema.table``, quoted as in SQL where needed).
    :param planned_subscriptions: how many subscriptions will be created for this table set.
    :param fix_replica_identity: ``none`` reports only; ``index`` runs ``ALTER TABLE ... REPLICA
        IDENTITY`` to use a key where one exists (DEFAULT with a primary key, else USING the best
        unique index on NOT NULL columns); ``full`` also sets FULL where no key exists (slow
        fallback). Tables are re-inspected afterwards and the report lists what changed.
    :param fail_on_warnings: fail on warnings (FULL identity, type differences) too.
    :param lock_timeout: how long each ``ALTER TABLE`` may wait for its lock.
    """

    template_fields: Sequence[str] = (
        "publisher_conn_id",
        "subscriber_conn_id",
        "publication",
        "tables",
        "fix_replica_identity",
    )
    ui_color = "#d8e8f8"

    def __init__(
        self,
        *,
        publisher_conn_id: str,
        subscriber_conn_id: str,
        publication: str | None = None,
        tables: Sequence[str] | None = None,
        planned_subscriptions: int = 1,
        fix_replica_identity: str = "none",
        fail_on_warnings: bool = False,
        lock_timeout: str = "5s",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if publication is None and tables is None:
            raise ValueError(
                f"{self.task_id}: give publication=, tables=, or both (the tables to check)"
            )
        if isinstance(planned_subscriptions, bool) or not isinstance(planned_subscriptions, int):
            raise TypeError(f"{self.task_id}: planned_subscriptions must be an int")
        if planned_subscriptions < 1:
            raise ValueError(
                f"{self.task_id}: planned_subscriptions must be at least 1, "
                f"got {planned_subscriptions}"
            )
        if "{{" not in fix_replica_identity:  # a template is checked once rendered
            _fix_mode(fix_replica_identity)
        self.publisher_conn_id = publisher_conn_id
        self.subscriber_conn_id = subscriber_conn_id
        self.publication = publication
        self.tables = tables
        self.planned_subscriptions = planned_subscriptions
        self.fix_replica_identity = fix_replica_identity
        self.fail_on_warnings = fail_on_warnings
        self.lock_timeout = lock_timeout
        self._locked_fixes: set[TableRef] = set()

    @cached_property
    def publisher_hook(self) -> PgLogicalReplicationHook:
        """Hook on the publisher."""
        return self._hook(self.publisher_conn_id)

    @cached_property
    def subscriber_hook(self) -> PgLogicalReplicationHook:
        """Hook on the subscriber."""
        return self._hook(self.subscriber_conn_id)

    @staticmethod
    def _hook(conn_id: str) -> PgLogicalReplicationHook:
        from airflow_pglogrepl.hooks.for_connection import replication_hook

        return replication_hook(conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        mode = _fix_mode(self.fix_replica_identity)
        self._locked_fixes = set()
        inspection = self.inspect()
        report = evaluate(inspection)
        if mode is not FixMode.NONE:
            report = self._fix(inspection, mode) or report
        value = report.to_dict()
        context["ti"].xcom_push(key="report", value=value)
        warnings_fail = self.fail_on_warnings and bool(report.warnings)
        if not report.ok or warnings_fail:
            self.log.error("%s", report.summary())
            # a retry can pass only where a lock alone kept a fix from being made
            locked = self._locked_fixes
            retry_helps = bool(report.problems) and all(p.table in locked for p in report.problems)
            raise PreflightFailedError(report, warnings_fail=warnings_fail, retryable=retry_helps)
        self.log.info("%s", report.summary())
        return value

    def inspect(self) -> Inspection:
        """Read both servers: settings, capacity in use, role, and the table set's facts."""
        pub, sub = self.publisher_hook, self.subscriber_hook
        with pub.session() as conn:
            tables, exists = self._table_set(conn)
            pub_tables = pub.table_facts(tables, conn=conn)
            leaves = {
                leaf
                for facts in pub_tables.values()
                for leaf in facts.leaf_partitions
                if leaf not in pub_tables
            }
            if leaves:
                pub_tables.update(pub.table_facts(sorted(leaves), conn=conn))
            publisher = SideFacts(
                server=pub.server_facts(conn=conn),
                tables=pub_tables,
                role=pub.role_facts(conn=conn),
                publisher_usage=pub.publisher_usage(conn=conn),
            )
        with sub.session() as conn:
            subscriber = SideFacts(
                server=sub.server_facts(conn=conn),
                tables=sub.table_facts(tables, conn=conn),
                subscriber_usage=sub.subscriber_usage(conn=conn),
            )
        return Inspection(
            tables=tuple(tables),
            publisher=publisher,
            subscriber=subscriber,
            publication=self.publication,
            publication_exists=exists,
            planned_subscriptions=self.planned_subscriptions,
        )

    def _table_set(self, conn: Conn) -> tuple[list[TableRef], bool]:
        """The given tables, then the publication's others; and whether the publication exists."""
        given = [self.tables] if isinstance(self.tables, str) else list(self.tables or ())
        tables = parse_tables(given)
        if self.publication is None:
            return tables, True
        published = self.publisher_hook.publication_tables(self.publication, conn=conn)
        if published is None:
            self.log.info(
                "Publication %r does not exist yet; checking the %d table(s) given",
                self.publication,
                len(tables),
            )
            return tables, False
        seen = set(tables)
        return tables + [t for t in published if t not in seen], True

    def _fix(self, inspection: Inspection, mode: FixMode) -> PreflightReport | None:
        """Apply the identity changes ``mode`` allows, re-inspect, report before and after.

        None when there was nothing to change. A change the server refuses is reported as a
        finding; the others still go ahead.
        """
        before = inspection.publisher.tables
        plans = [p for facts in before.values() if (p := plan_fix(facts, mode)) is not None]
        if not plans:
            return None
        done: list[tuple[TableRef, str]] = []
        failures: list[Finding] = []
        for plan in plans:
            try:
                self.publisher_hook.set_replica_identity(
                    plan.table, plan.mode, plan.index, lock_timeout=self.lock_timeout
                )
            except ReplicaIdentityChangeError as exc:
                failures.append(fix_failed(plan, exc.reason, exc.fix))
                if exc.retryable:
                    self._locked_fixes.add(plan.table)
            else:
                done.append((plan.table, plan.statement))
        after = self.inspect()
        applied = [
            AppliedFix(
                table=table,
                statement=statement,
                before=assess(before[table]).cls.value,
                after=assess(after.publisher.tables[table]).cls.value
                if table in after.publisher.tables
                else "gone",
            )
            for table, statement in done
        ]
        return evaluate(after, fixes_applied=applied, fix_failures=failures)


def _fix_mode(value: str) -> FixMode:
    try:
        return FixMode(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in FixMode)
        raise ValueError(f"fix_replica_identity must be one of {choices}, got {value!r}") from None
