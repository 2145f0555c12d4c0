"""The lake's writer lock through the Airflow hook: one holder per slot's lake and database,
the refusal naming the holding run (its role in its session's name), released on leaving, and a
session that cannot be opened naming the Airflow connection."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from airflow_pglogrepl.exceptions import ConnectionFailedError, LakeWriterBusyError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import set_airflow_connection
from tests.support.databases import Database


def test_one_writer_per_lake_and_the_refusal_names_the_holder(
    database: Database, hook: PgLogicalReplicationHook
) -> None:
    with database.hook.writer_lock("orders", role="snapshot") as lock:
        lock.check()
        with pytest.raises(LakeWriterBusyError) as caught, database.hook.writer_lock("orders"):
            pass
        holder = caught.value.holder
        assert holder is not None and holder["pid"] == lock.pid
        assert str(holder["application_name"]).startswith("pglogrepl snapshot orders ")
        assert f"pg_terminate_backend({lock.pid})" in str(caught.value)
        with database.hook.writer_lock("other") as other:  # another slot's lake: free
            other.check()
        with hook.writer_lock("orders") as elsewhere:  # the same slot name in another database
            elsewhere.check()
    with database.hook.writer_lock("orders") as again:  # released when its block ended
        again.check()


def test_a_lock_that_cannot_connect_names_the_airflow_connection(publisher: PgCluster) -> None:
    set_airflow_connection(
        "locks_wrong_password",
        f"postgres://{quote(publisher.superuser)}:n0t-it@{publisher.host}:{publisher.port}/postgres",
    )
    hook = PgLogicalReplicationHook(postgres_conn_id="locks_wrong_password")
    with pytest.raises(ConnectionFailedError) as caught, hook.writer_lock("orders"):
        pass
    assert "(Airflow connection 'locks_wrong_password')" in str(caught.value)
    assert "n0t-it" not in str(caught.value)
