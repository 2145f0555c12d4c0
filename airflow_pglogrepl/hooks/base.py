"""Sessions for the hook family: libpq parameters from the Airflow connection, open/close.

Every hook mixin (server, slots, publications, subscriptions, catalog) runs its statements through
``session()`` or ``_use(conn)``; nothing else in the project opens PostgreSQL connections, except
the Spark applications, which receive a DSN through the environment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from airflow.providers.postgres.hooks.postgres import PostgresHook
from psycopg.rows import dict_row

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.postgres.connect import (
    AsyncConn,
    Conn,
    bounded_connect,
    connect,
    connect_error,
    notice_logger,
    run_ddl,
    show,
)
from airflow_pglogrepl.postgres.lsn_adapters import register_lsn_adapters

__all__ = ["AsyncConn", "Conn", "PgSessionHook", "mask", "run_ddl", "show"]


def mask(secret: str) -> None:
    """Hide ``secret`` wherever Airflow writes the task's log, from the moment it is read (a
    password, an object store's key): every place that reads one calls this first."""
    from airflow.sdk.log import mask_secret

    mask_secret(secret)


class PgSessionHook(PostgresHook):
    """Opens psycopg 3 sessions for an Airflow Postgres connection (base of the hook mixins)."""

    def connection_params(self) -> dict[str, str]:
        """libpq keyword parameters for this hook's connection (contains the password)."""
        return self._params_from(self.connection)

    async def aconnection_params(self) -> dict[str, str]:
        """``connection_params`` for triggers: the connection is looked up without blocking."""
        return self._params_from(await self.aget_connection(self.get_conn_id()))

    def _params_from(self, conn: Any) -> dict[str, str]:
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
    def session(
        self,
        *,
        replication: bool = False,
        autocommit: bool = True,
        application_name: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Iterator[Conn]:
        """An open psycopg connection with ``pg_lsn`` read and written as ``LSN``.

        ``replication=True`` opens a ``replication=database`` connection, which accepts the
        replication protocol's commands (``CREATE_REPLICATION_SLOT ... SNAPSHOT 'export'``).
        Connection failures raise ``ConnectionFailedError`` with the password removed.
        ``secrets``: others the session's statements carry (a publisher's password), masked in
        the server's notices as the session's own are.
        """
        with connect(
            self.connection_params(),
            label=self._source_label(),
            replication=replication,
            autocommit=autocommit,
            application_name=application_name,
            secrets=secrets,
        ) as conn:
            yield conn

    @asynccontextmanager
    async def asession(self) -> AsyncIterator[AsyncConn]:
        """``session()`` for triggers: an autocommit ``psycopg.AsyncConnection``, given up
        within the connect timeout as ``session()`` is (``bounded_connect``): a server that
        accepts and never answers would otherwise hold the triggerer's poll for minutes."""
        params = await self.aconnection_params()
        try:
            conn = await psycopg.AsyncConnection.connect(
                conninfo.make_dsn(bounded_connect(params)), autocommit=True, row_factory=dict_row
            )
        except psycopg.OperationalError as exc:
            raise connect_error(params, exc, self._source_label()) from None
        conn.add_notice_handler(
            notice_logger(conninfo.describe(params), conninfo.secrets_of(params))
        )
        register_lsn_adapters(conn)
        async with conn:
            yield conn

    def _source_label(self) -> str:
        """How errors and logs name where this hook's server came from (never its secrets)."""
        return f"Airflow connection {self.get_conn_id()!r}"

    @contextmanager
    def _use(self, conn: Conn | None) -> Iterator[Conn]:
        if conn is not None:
            yield conn
        else:
            with self.session() as own:
                yield own
