"""Building hooks for operators and sensors in one place (and lazily: no I/O at parse time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook


def replication_hook(conn_id: str, database: str | None = None) -> PgLogicalReplicationHook:
    """A ``PgLogicalReplicationHook`` for ``conn_id`` (optionally another database)."""
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook

    if database:
        return PgLogicalReplicationHook(postgres_conn_id=conn_id, database=database)
    return PgLogicalReplicationHook(postgres_conn_id=conn_id)
