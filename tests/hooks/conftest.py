"""Fixtures of the hook tests."""

from __future__ import annotations

import itertools

import pytest

from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.databases import Database

_databases = itertools.count(1)


@pytest.fixture
def hook(publisher_conn_id: str) -> PgLogicalReplicationHook:
    return PgLogicalReplicationHook(postgres_conn_id=publisher_conn_id)


@pytest.fixture
def database(publisher: PgCluster, publisher_conn_id: str) -> Database:
    """A database of its own on the publisher, named like an injection, with the hook of the
    publisher's Airflow connection pointed at it (``database=``)."""
    name = f"hook db {next(_databases)}; '\""
    publisher.create_database(name)
    return Database(publisher, name, replication_hook(publisher_conn_id, database=name))
