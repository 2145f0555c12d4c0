"""Fixtures of the hook tests."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook


@pytest.fixture
def hook(publisher_conn_id: str) -> PgLogicalReplicationHook:
    return PgLogicalReplicationHook(postgres_conn_id=publisher_conn_id)
