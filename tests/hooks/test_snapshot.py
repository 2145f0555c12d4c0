"""A slot created with an exported snapshot through the Airflow hook: the snapshot is
importable while the result is open and sees what committed before the slot's consistent
point, a temporary slot goes with its session, and the refusals name the slot and the
Airflow connection."""

from __future__ import annotations

from urllib.parse import quote

import psycopg
import pytest

from airflow_pglogrepl.exceptions import (
    ConnectionFailedError,
    InvalidSlotNameError,
    SlotAlreadyExistsError,
    SlotNotFoundError,
)
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import set_airflow_connection
from tests.support.databases import Database


def test_the_exported_snapshot_sees_what_committed_before_the_slot(
    database: Database, slot_name: str
) -> None:
    database.sql("CREATE TABLE t (id int); INSERT INTO t VALUES (1)")
    hook = database.hook
    with hook.create_slot_with_snapshot(slot_name, temporary=True) as exported:
        assert (exported.slot, exported.plugin, exported.temporary) == (slot_name, "pgoutput", True)
        database.sql("INSERT INTO t VALUES (2)")  # after the consistent point
        with database.cluster.connect(database.name) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute(f"SET TRANSACTION SNAPSHOT '{exported.snapshot_name}'")
            assert reader.execute("SELECT array_agg(id) FROM t").fetchone() == ([1],)
        assert hook.get_slot(slot_name).confirmed_flush_lsn == exported.consistent_point
    with pytest.raises(SlotNotFoundError):  # temporary: gone with its session
        hook.get_slot(slot_name)
    with database.cluster.connect(database.name) as late, pytest.raises(psycopg.Error):
        late.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        late.execute(f"SET TRANSACTION SNAPSHOT '{exported.snapshot_name}'")


def test_a_slot_that_exists_or_a_bad_name_is_refused(database: Database, slot_name: str) -> None:
    hook = database.hook
    with hook.create_slot_with_snapshot(slot_name, plugin="test_decoding"):
        pass
    try:
        assert hook.get_slot(slot_name).plugin == "test_decoding"  # not temporary: it stays
        with pytest.raises(SlotAlreadyExistsError, match=slot_name):
            hook.create_slot_with_snapshot(slot_name)
    finally:
        hook.drop_slot(slot_name)
    with pytest.raises(InvalidSlotNameError):
        hook.create_slot_with_snapshot('bad"; name')


def test_a_session_that_cannot_open_names_the_airflow_connection(publisher: PgCluster) -> None:
    set_airflow_connection(
        "snapshot_wrong_password",
        f"postgres://{quote(publisher.superuser)}:n0t-it@{publisher.host}:{publisher.port}/postgres",
    )
    hook = PgLogicalReplicationHook(postgres_conn_id="snapshot_wrong_password")
    with pytest.raises(ConnectionFailedError) as caught:
        hook.create_slot_with_snapshot("never_made")
    assert "(Airflow connection 'snapshot_wrong_password')" in str(caught.value)
    assert "n0t-it" not in str(caught.value)
