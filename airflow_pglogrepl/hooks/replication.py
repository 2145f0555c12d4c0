"""``PgLogicalReplicationHook``: the one place in the project that speaks SQL to PostgreSQL.

Operators, sensors and the Spark applications call methods here; none of them compose
statements. Every identifier goes through ``psycopg.sql.Identifier`` and every value is a bound
parameter, so hostile names are data, never SQL. The methods live in one mixin per concept
(``server``, ``slots`` ...) so each file stays about one thing; this class puts them together.
"""

from __future__ import annotations

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.hooks.catalog import CatalogMixin
from airflow_pglogrepl.hooks.conflicts import ConflictsMixin
from airflow_pglogrepl.hooks.fence import FenceMixin
from airflow_pglogrepl.hooks.locks import WriterLockMixin
from airflow_pglogrepl.hooks.parity import ParityMixin
from airflow_pglogrepl.hooks.publications import PublicationsMixin
from airflow_pglogrepl.hooks.sequences import SequencesMixin
from airflow_pglogrepl.hooks.server import ServerMixin
from airflow_pglogrepl.hooks.slots import OUTPUT_PLUGINS, SlotsMixin
from airflow_pglogrepl.hooks.snapshot import SnapshotMixin
from airflow_pglogrepl.hooks.subscriptions import SubscriptionsMixin

__all__ = ["OUTPUT_PLUGINS", "PgLogicalReplicationHook"]


class PgLogicalReplicationHook(
    SnapshotMixin,
    WriterLockMixin,
    FenceMixin,
    SequencesMixin,
    ParityMixin,
    ConflictsMixin,
    CatalogMixin,
    PublicationsMixin,
    SubscriptionsMixin,
    SlotsMixin,
    ServerMixin,
):
    """Logical replication on one PostgreSQL server, through an Airflow Postgres connection.

    Takes the same connections as ``PostgresHook`` (``conn_type`` ``postgres`` or
    ``pglogrepl``); libpq extras such as ``sslmode`` pass through. Each method opens a short
    autocommit session unless given ``conn=`` (needed for temporary slots, which live only as long
    as the session that created them).

    :param postgres_conn_id: the Airflow connection id.
    :param database: overrides the connection's database (slots belong to one database).
    """

    conn_type = "pglogrepl"
    hook_name = "PostgreSQL logical replication"


class DsnReplicationHook(PgLogicalReplicationHook):
    """The same hook for a libpq DSN instead of an Airflow connection (scripts, benchmarks and
    tests that want every hook method on a server they reach by DSN).

    The Spark applications do not use it: they need no Airflow, and use ``postgres.source``'s
    ``PgSource`` over the same statements.
    """

    def __init__(self, dsn: str, *, label: str = SOURCE_DSN_ENV) -> None:
        super().__init__(postgres_conn_id=label)
        from airflow_pglogrepl.postgres.connect import dsn_params

        self._dsn_params = dsn_params(dsn)
        self._label = label

    def connection_params(self) -> dict[str, str]:
        return dict(self._dsn_params)

    async def aconnection_params(self) -> dict[str, str]:
        return dict(self._dsn_params)

    def get_conn_id(self) -> str:
        return self._label

    def _source_label(self) -> str:
        return self._label  # a DSN, not an Airflow connection: named as given
