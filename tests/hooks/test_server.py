"""Server facts and the current WAL position, from the live publisher."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.testing.pgcluster import PgCluster

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion


def test_server_facts(hook: PgLogicalReplicationHook) -> None:
    facts = hook.server_facts()
    assert facts.wal_level == "logical"
    assert facts.major_version >= 13
    assert facts.max_replication_slots == 32
    assert facts.max_wal_senders == 32
    assert facts.max_logical_replication_workers == 16
    assert facts.max_worker_processes == 24
    assert facts.max_sync_workers_per_subscription == 4
    assert facts.logical_decoding_work_mem == 64 * 1024 * 1024  # default 64MB, in bytes
    assert facts.max_slot_wal_keep_size is None  # -1: unlimited
    assert facts.in_recovery is False
    assert hook.require_logical_decoding() == facts


def test_current_wal_lsn_moves_forward(
    hook: PgLogicalReplicationHook, publisher: PgCluster
) -> None:
    before = hook.current_wal_lsn()
    publisher.execute("CREATE TABLE IF NOT EXISTS lsn_move(x int); INSERT INTO lsn_move VALUES (1)")
    after = hook.current_wal_lsn()
    assert isinstance(before, LSN)
    assert after > before
