"""``PgLogicalReplicationHook``: the one place in the project that speaks SQL to PostgreSQL.

Operators, sensors and the Spark applications call methods here; none of them compose
statements. Every identifier goes through ``psycopg.sql.Identifier`` and every value is a bound
parameter, so hostile names are data, never SQL. The methods live in one mixin per concept
(``server``, ``slots`` ...) so each file stays about one thing; this class puts them together.
"""

from __future__ import annotations

from airflow_pglogrepl.hooks.catalog import CatalogMixin
from airflow_pglogrepl.hooks.publications import PublicationsMixin
from airflow_pglogrepl.hooks.server import ServerMixin
from airflow_pglogrepl.hooks.slots import OUTPUT_PLUGINS, SlotsMixin
from airflow_pglogrepl.hooks.subscriptions import SubscriptionsMixin

__all__ = ["OUTPUT_PLUGINS", "PgLogicalReplicationHook"]


class PgLogicalReplicationHook(
    CatalogMixin, PublicationsMixin, SubscriptionsMixin, SlotsMixin, ServerMixin
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
