"""Sessions for the hook family: libpq parameters from the Airflow connection, open/close.

Every hook mixin (server, slots, publications, subscriptions, catalog) runs its statements through
``session()`` or ``_use(conn)``; nothing else in the project opens PostgreSQL connections, except
the Spark applications, which receive a DSN through the environment.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg
from airflow.providers.postgres.hooks.postgres import PostgresHook
from psycopg.rows import dict_row

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import ConnectionFailedError
from airflow_pglogrepl.hooks.lsn_adapters import register_lsn_adapters

Conn: TypeAlias = psycopg.Connection[dict[str, Any]]


class PgSessionHook(PostgresHook):
    """Opens psycopg 3 sessions for an Airflow Postgres connection (base of the hook mixins)."""

    def connection_params(self) -> dict[str, str]:
        """libpq keyword parameters for this hook's connection (contains the password)."""
        conn = self.connection
        login, password, port = conn.login, conn.password, conn.port
        if conn.extra_dejson.get("iam", False):
            login, password, port = self.get_iam_token(conn)
        return conninfo.libpq_params(
            host=conn.host,
            port=port,
            user=login,
            password=password,
            dbname=self.database or conn.schema,
            extra=conn.extra_dejson,
        )

    @contextmanager
    def session(self, *, replication: bool = False, autocommit: bool = True) -> Iterator[Conn]:
        """An open psycopg connection with ``pg_lsn`` read and written as ``LSN``.

        ``replication=True`` opens a ``replication=database`` connection, which accepts the
        replication protocol's commands (``CREATE_REPLICATION_SLOT ... SNAPSHOT 'export'``).
        Connection failures raise ``ConnectionFailedError`` with the password removed.
        """
        params = self.connection_params()
        if replication:
            params["replication"] = "database"
        try:
            conn = psycopg.connect(
                conninfo.make_dsn(params),
                autocommit=autocommit,
                row_factory=dict_row,
                cursor_factory=psycopg.ClientCursor if replication else psycopg.Cursor,
            )
        except psycopg.OperationalError as exc:
            reason = conninfo.redact(str(exc).strip(), conninfo.secrets_of(params))
            raise ConnectionFailedError(
                f"cannot connect to PostgreSQL {conninfo.describe(params)} "
                f"(Airflow connection {self.get_conn_id()!r}): {reason}. Fix: check host, port, "
                f"login and password of that connection and that the server accepts it "
                f"(pg_hba.conf)"
            ) from None
        register_lsn_adapters(conn)
        with conn:
            yield conn

    @contextmanager
    def _use(self, conn: Conn | None) -> Iterator[Conn]:
        if conn is not None:
            yield conn
        else:
            with self.session() as own:
                yield own


def show(conn: Conn, name: str) -> str:
    """A server setting's current value (``current_setting``) as text."""
    row = conn.execute("SELECT current_setting(%s) AS value", (name,)).fetchone()
    return str(row["value"]) if row else "unknown"
