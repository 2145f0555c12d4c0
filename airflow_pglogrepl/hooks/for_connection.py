"""The one public way to get a hook from an Airflow connection id.

Operators, sensors, probes and DAGs build their hooks here, and lazily: importing this module
imports neither psycopg nor the hook, so a DAG file that uses it stays light to parse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook

__all__ = ["replication_hook"]


def replication_hook(conn_id: str, database: str | None = None) -> PgLogicalReplicationHook:
    """A ``PgLogicalReplicationHook`` for ``conn_id`` (optionally another database)."""
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook

    if database:
        return PgLogicalReplicationHook(postgres_conn_id=conn_id, database=database)
    return PgLogicalReplicationHook(postgres_conn_id=conn_id)
