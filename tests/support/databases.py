"""A database of its own on a live cluster, reached through an Airflow connection's hook."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.testing.pgcluster import PgCluster


@dataclass
class Database:
    """``name`` on ``cluster``; ``hook`` is the public hook of an Airflow connection to it."""

    cluster: PgCluster
    name: str
    hook: PgLogicalReplicationHook

    def sql(self, statement: Any, params: Any = None) -> list[tuple[Any, ...]]:
        return self.cluster.execute(statement, params, dbname=self.name)
