"""A source database of its own on the publisher, with its slot and publication."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
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


_ids = itertools.count(1)


@contextlib.contextmanager
def database_of_its_own(publisher: PgCluster, prefix: str, publication: str) -> Iterator[Source]:
    """A new database on ``publisher`` named ``<prefix>_<n>`` and a slot name for it (the test
    creates the slot); its slots no session holds are dropped afterwards, so a slot left by a
    failed test pins no WAL for the tests after it."""
    n = next(_ids)
    db = f"{prefix}_{n}"
    publisher.create_database(db)
    source = Source(publisher, db, f"{prefix}_slot_{n}", publication)
    yield source
    source.sql(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
        " WHERE database = current_database() AND NOT active"
    )
