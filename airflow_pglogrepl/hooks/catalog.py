"""Catalog inspection for preflight checks: roles, tables, columns, replica identity, privileges
(the statements: ``postgres/catalog.py``).

Every method reads a batch in one statement (all tables at once, never one query per table) and
returns the plain records of ``airflow_pglogrepl.models.facts``, which the pure preflight rules
judge. ``set_replica_identity`` is the one statement here that changes anything: its refusals
become ``ReplicaIdentityChangeError`` with the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from psycopg import errors as pgerr

from airflow_pglogrepl.exceptions import ReplicaIdentityChangeError
from airflow_pglogrepl.hooks.base import Conn, PgSessionHook
from airflow_pglogrepl.models.facts import PublisherUsage, RoleFacts, SubscriberUsage, TableFacts
from airflow_pglogrepl.models.records import ColumnOrigins
from airflow_pglogrepl.postgres import catalog, columns
from airflow_pglogrepl.tables import TableRef


class CatalogMixin(PgSessionHook):
    """Reads what preflight checks need from the system catalogs."""

    def column_origins(
        self, table: TableRef, names: Sequence[str], *, conn: Conn | None = None
    ) -> ColumnOrigins:
        """What rows from before an ``ADD COLUMN`` hold in each of ``names`` (the lake's
        question when it meets a new column; see ``ColumnOrigin``)."""
        with self._use(conn) as c:
            return columns.column_origins(c, table, names)

    def role_facts(self, *, conn: Conn | None = None) -> RoleFacts:
        """The connecting role (``current_user``): superuser, REPLICATION, LOGIN, BYPASSRLS."""
        with self._use(conn) as c:
            return catalog.role_facts(c)

    def table_facts(
        self, tables: Iterable[TableRef], *, conn: Conn | None = None
    ) -> dict[TableRef, TableFacts]:
        """Facts about each of ``tables`` that exists; absent tables are absent from the result.

        Matching is exact (``TableRef`` holds catalog spelling), so any name works, however
        hostile. Relations of any kind are returned; judging the kind is the caller's business.
        """
        refs = list(tables)
        if not refs:
            return {}
        with self._use(conn) as c:
            return catalog.table_facts(c, refs)

    def publisher_usage(self, *, conn: Conn | None = None) -> PublisherUsage:
        """Slots that exist (any type) and WAL senders running: capacity already taken."""
        with self._use(conn) as c:
            return catalog.publisher_usage(c)

    def subscriber_usage(self, *, conn: Conn | None = None) -> SubscriberUsage:
        """Subscriptions (cluster-wide) and the sync/parallel workers running now."""
        with self._use(conn) as c:
            return catalog.subscriber_usage(c)

    def set_replica_identity(
        self,
        table: TableRef,
        mode: str,
        index: str | None = None,
        *,
        lock_timeout: str = "5s",
        conn: Conn | None = None,
    ) -> None:
        """``ALTER TABLE table REPLICA IDENTITY {DEFAULT | FULL | NOTHING | USING INDEX index}``.

        The statement takes an ACCESS EXCLUSIVE lock; it gives up after ``lock_timeout`` rather
        than queue behind a long transaction and stall every other session on the table.
        Raises ``ReplicaIdentityChangeError`` (not the owner, lock timeout, unusable index ...).
        """
        statement = catalog.replica_identity_statement(table, mode, index)
        with self._use(conn) as c:
            text = statement.as_string(c)
            try:
                catalog.set_replica_identity(c, statement, lock_timeout)
            except pgerr.LockNotAvailable as exc:
                locked = ReplicaIdentityChangeError(
                    table,
                    text,
                    f"the table stayed locked by other sessions for lock_timeout ({lock_timeout})",
                    "retry when no long transaction holds it (see pg_locks / pg_stat_activity)",
                )
                locked.retryable = True
                raise locked from exc
            except pgerr.InsufficientPrivilege as exc:
                raise ReplicaIdentityChangeError(
                    table,
                    text,
                    _reason(exc),
                    "run it as the table's owner or a superuser",
                ) from exc
            except (
                pgerr.UndefinedTable,
                pgerr.UndefinedObject,
                pgerr.WrongObjectType,
                pgerr.ObjectNotInPrerequisiteState,
                pgerr.FeatureNotSupported,
            ) as exc:
                raise ReplicaIdentityChangeError(
                    table,
                    text,
                    _reason(exc),
                    "inspect the table and its indexes again; it changed or the index cannot serve",
                ) from exc
        self.log.info("Replica identity changed: %s", text)


def _reason(exc: pgerr.Error) -> str:
    return exc.diag.message_primary or str(exc).strip()
