"""PgLogicalReplicationHook against live clusters: the slot life cycle."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl import identifiers
from airflow_pglogrepl.exceptions import (
    InvalidSlotNameError,
    ServerNotConfiguredError,
    SlotAdvanceError,
    SlotAlreadyExistsError,
    SlotInUseError,
    SlotNotFoundError,
    WrongPluginError,
)
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.airflow import set_airflow_connection

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion


def test_slot_life_cycle(
    hook: PgLogicalReplicationHook, publisher: PgCluster, slot_name: str
) -> None:
    created = hook.create_logical_slot(slot_name)
    assert created.name == slot_name and created.plugin == "pgoutput"
    slot = hook.get_slot(slot_name, plugin="pgoutput")
    assert slot.is_logical and slot.plugin == "pgoutput" and slot.database == "postgres"
    assert slot.active is False and slot.active_pid is None and slot.temporary is False
    assert slot.confirmed_flush_lsn == created.lsn
    assert slot.restart_lsn is not None and slot.restart_lsn <= created.lsn
    assert slot.wal_status == "reserved"
    assert slot.retained_bytes == slot.current_lsn - slot.restart_lsn
    assert slot_name in [s.name for s in hook.list_slots()]

    publisher.execute("CREATE TABLE IF NOT EXISTS life(x int); INSERT INTO life VALUES (1)")
    target = hook.current_wal_lsn()
    end = hook.advance_slot(slot_name, target)
    assert end == target
    assert hook.get_slot(slot_name).confirmed_flush_lsn == target

    with pytest.raises(SlotAdvanceError, match=slot_name):
        hook.advance_slot(slot_name, created.lsn)  # backwards

    assert hook.drop_slot(slot_name) is True
    with pytest.raises(SlotNotFoundError):
        hook.get_slot(slot_name)
    assert hook.drop_slot(slot_name, missing_ok=True) is False


def test_advance_beyond_the_flushed_wal_stops_there(
    hook: PgLogicalReplicationHook, slot_name: str
) -> None:
    hook.create_logical_slot(slot_name)
    try:
        far = hook.current_wal_lsn() + 10 * 1024 * 1024
        end = hook.advance_slot(slot_name, str(far))
        assert end < far
        assert end <= hook.current_wal_lsn()
        assert hook.get_slot(slot_name).confirmed_flush_lsn == end
    finally:
        hook.drop_slot(slot_name)


def test_missing_slot_errors(hook: PgLogicalReplicationHook) -> None:
    with pytest.raises(SlotNotFoundError, match="no_such_slot"):
        hook.get_slot("no_such_slot")
    with pytest.raises(SlotNotFoundError, match="no_such_slot"):
        hook.advance_slot("no_such_slot", LSN("0/1"))
    with pytest.raises(SlotNotFoundError):
        hook.drop_slot("no_such_slot")


def test_duplicate_slot(hook: PgLogicalReplicationHook, slot_name: str) -> None:
    hook.create_logical_slot(slot_name)
    try:
        with pytest.raises(SlotAlreadyExistsError, match=slot_name):
            hook.create_logical_slot(slot_name)
    finally:
        hook.drop_slot(slot_name)


def test_two_phase_slot(hook: PgLogicalReplicationHook, slot_name: str) -> None:
    hook.create_logical_slot(slot_name, two_phase=True)  # PostgreSQL names it "twophase"
    try:
        assert hook.get_slot(slot_name).two_phase is True
    finally:
        hook.drop_slot(slot_name)


def test_wrong_plugin(hook: PgLogicalReplicationHook, slot_name: str) -> None:
    hook.create_logical_slot(slot_name, plugin="test_decoding")
    try:
        assert hook.get_slot(slot_name).plugin == "test_decoding"
        with pytest.raises(WrongPluginError) as info:
            hook.get_slot(slot_name, plugin="pgoutput")
        assert "test_decoding" in str(info.value) and "pgoutput" in str(info.value)
    finally:
        hook.drop_slot(slot_name)


def test_temporary_slot_lives_with_its_session(
    hook: PgLogicalReplicationHook, slot_name: str
) -> None:
    with pytest.raises(ValueError, match="conn="):
        hook.create_logical_slot(slot_name, temporary=True)
    with hook.session() as conn:
        hook.create_logical_slot(slot_name, temporary=True, conn=conn)
        assert hook.get_slot(slot_name).temporary is True
    with pytest.raises(SlotNotFoundError):
        hook.get_slot(slot_name)


@pytest.fixture
def consumer(
    publisher: PgCluster,
    pg_tool: Callable[[str], Path],
    hook: PgLogicalReplicationHook,
    slot_name: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """pg_recvlogical streaming from the slot: the slot is active in another session."""
    hook.create_logical_slot(slot_name)
    proc = subprocess.Popen(
        [str(pg_tool("pg_recvlogical")), "-h", publisher.host, "-p", str(publisher.port),
         "-U", publisher.superuser, "-d", "postgres", "--slot", slot_name, "--start",
         "--no-loop", "-o", "proto_version=1", "-o", "publication_names=none_yet",
         "-f", os.devnull],
        env={**os.environ, "PGPASSWORD": publisher.password},
    )  # fmt: skip
    try:

        def streaming() -> bool:
            assert proc.poll() is None, "pg_recvlogical exited; see its stderr above"
            return hook.get_slot(slot_name).active

        wait_until(streaming, what=f"{slot_name} active")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        wait_until(lambda: not hook.get_slot(slot_name).active, what=f"{slot_name} released")
        hook.drop_slot(slot_name)


def test_slot_active_in_another_session(
    hook: PgLogicalReplicationHook, consumer: subprocess.Popen[bytes], slot_name: str
) -> None:
    slot = hook.get_slot(slot_name)
    assert slot.active and slot.active_pid
    with pytest.raises(SlotInUseError) as info:
        hook.advance_slot(slot_name, hook.current_wal_lsn())
    assert info.value.active_pid == slot.active_pid
    assert str(slot.active_pid) in str(info.value)
    with pytest.raises(SlotInUseError):
        hook.drop_slot(slot_name)


def test_wal_level_replica_is_refused(replica_level_cluster: PgCluster) -> None:
    set_airflow_connection("pglogrepl_replica_level", replica_level_cluster.airflow_uri())
    hook = PgLogicalReplicationHook(postgres_conn_id="pglogrepl_replica_level")
    with pytest.raises(ServerNotConfiguredError) as info:
        hook.create_logical_slot("never_created")
    assert info.value.setting == "wal_level"
    assert "wal_level" in str(info.value) and "'replica'" in str(info.value)
    with pytest.raises(ServerNotConfiguredError, match="wal_level"):
        hook.require_logical_decoding()
    assert hook.list_slots() == []


def test_wal_level_replica_names_the_server_to_restart(replica_level_cluster: PgCluster) -> None:
    """Issue 27: the fix says which server to set and restart (before: "restart PostgreSQL")."""
    set_airflow_connection("pglogrepl_replica_level", replica_level_cluster.airflow_uri())
    hook = PgLogicalReplicationHook(postgres_conn_id="pglogrepl_replica_level")
    where = f"{replica_level_cluster.host}:{replica_level_cluster.port}"
    for attempt in (
        lambda: hook.create_logical_slot("never_created"),
        hook.require_logical_decoding,
    ):
        with pytest.raises(ServerNotConfiguredError) as info:
            attempt()
        assert info.value.retryable is False and info.value.server == where
        assert str(info.value).startswith(f"the server {where} is not configured")
        assert f"Fix: set wal_level = logical on {where} (ALTER SYSTEM" in str(info.value)
        assert "and restart it; wal_level only changes on restart" in str(info.value)


HOSTILE = 'we"ird; drop table x'


def test_hostile_slot_name_is_rejected_and_never_executed(
    hook: PgLogicalReplicationHook, publisher: PgCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher.execute("CREATE TABLE IF NOT EXISTS x(id int)")
    for call in (hook.create_logical_slot, hook.get_slot, hook.drop_slot):
        with pytest.raises(InvalidSlotNameError):
            call(HOSTILE)
    # Past the client-side check, the name still reaches the server only as a bound value.
    import airflow_pglogrepl.postgres.slots as module

    monkeypatch.setattr(module, "validate_slot_name", lambda name: name)
    monkeypatch.setattr(identifiers, "validate_slot_name", lambda name: name)
    with pytest.raises(InvalidSlotNameError):
        hook.create_logical_slot(HOSTILE)
    with pytest.raises(SlotNotFoundError):
        hook.get_slot(HOSTILE)
    assert publisher.execute("SELECT to_regclass('public.x') IS NOT NULL") == [(True,)]


def test_an_idle_timeout_is_seen_coming_and_named_when_it_struck(pg_bindir: Path) -> None:
    """PostgreSQL 18's idle_replication_slot_timeout: the health check fails while the slot is
    still usable, and once a checkpoint invalidated it the refusal names the timeout (not
    max_slot_wal_keep_size, which would not help)."""
    import datetime as dt

    from airflow_pglogrepl.hooks.replication import DsnReplicationHook
    from airflow_pglogrepl.models.verdicts import HealthPolicy, drain_refusal, slot_health
    from airflow_pglogrepl.testing.pgcluster import local_cluster

    with local_cluster("idle-timeout") as cluster:
        if int(cluster.execute("SHOW server_version_num")[0][0]) < 180000:
            pytest.skip("idle_replication_slot_timeout needs PostgreSQL 18+")
        hook = DsnReplicationHook(cluster.dsn())
        hook.create_logical_slot("idle_one", plugin="pgoutput")
        cluster.execute("ALTER SYSTEM SET idle_replication_slot_timeout = '1s'")
        cluster.execute("SELECT pg_reload_conf()")
        wait_until(lambda: hook.server_facts().idle_replication_slot_timeout_s == 1,
                   what="the reload", timeout=30)  # fmt: skip
        wait_until(lambda: cluster.execute(
            "SELECT now() - inactive_since > interval '1s' FROM pg_replication_slots")[0][0],
            what="a second of inactivity", timeout=30)  # fmt: skip
        slot = hook.get_slot("idle_one")
        assert slot.inactive_since is not None and slot.invalidation_reason is None
        (warning,) = slot_health(
            slot, HealthPolicy(), max_slot_wal_keep_size=None, inactive_since=slot.inactive_since,
            now=dt.datetime.now(dt.UTC), idle_timeout_s=1,
        )  # fmt: skip
        assert "idle_replication_slot_timeout" in warning

        def invalidated() -> bool:
            cluster.execute("CHECKPOINT")
            return hook.get_slot("idle_one").invalidation_reason is not None

        wait_until(invalidated, what="the invalidation at a checkpoint", timeout=30)
        lost = hook.get_slot("idle_one")
        assert (lost.wal_status, lost.invalidation_reason) == ("lost", "idle_timeout")
        refusal = drain_refusal(lost)
        assert refusal is not None and "idle_replication_slot_timeout" in str(refusal)
