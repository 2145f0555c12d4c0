"""A source database of its own on the publisher, with its slot and publication."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.testing.pgcluster import PgCluster


@dataclass
class Source:
    cluster: PgCluster
    db: str
    slot: str
    publication: str

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.db)

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.cluster.execute(statement, params, dbname=self.db)

    def hook(self) -> DsnReplicationHook:
        return DsnReplicationHook(self.dsn)
