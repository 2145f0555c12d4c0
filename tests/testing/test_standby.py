"""The tests' streaming standby (``testing.standby``): a base backup of a cluster that streams
from it, holds a failover slot synchronized from 17 on, and accepts writes once promoted, on a
new timeline of the same system."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, start_cluster
from airflow_pglogrepl.testing.standby import promote, start_standby, synced
from airflow_pglogrepl.testing.wait import wait_until

pytestmark = pytest.mark.pgversion

IDENTITY = ("SELECT system_identifier::text FROM pg_control_system()",
            "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")  # fmt: skip


def test_a_standby_streams_then_is_promoted_onto_a_new_timeline(
    pg_bindir: Path, pg_bindir_of: Callable[[int], Path]
) -> None:
    base = Path(tempfile.mkdtemp(prefix="pglogrepl-standby-"))
    os.chmod(base, 0o755)
    primary = start_cluster("standby-test", base / "primary", LOGICAL_SETTINGS, pg_bindir)
    standby = None
    try:
        major = int(primary.execute("SHOW server_version_num")[0][0]) // 10000
        basebackup = pg_bindir / "pg_basebackup"
        if not basebackup.is_file():  # (the 16 build has none; 18's backs it up)
            basebackup = pg_bindir_of(18) / "pg_basebackup"
        standby = start_standby(primary, base / "standby", basebackup=basebackup)
        if major >= 17:
            primary.execute("SELECT pg_create_logical_replication_slot('f', 'pgoutput', false,"
                            " false, true)")  # fmt: skip
            wait_until(lambda: synced(standby, "f"), what="slot f synchronized")  # type: ignore[arg-type]
        primary.execute("CREATE TABLE t AS SELECT 1 AS id")
        wait_until(lambda: standby.execute("SELECT to_regclass('t') IS NOT NULL")[0][0],  # type: ignore[union-attr]
                   what="the table replayed")  # fmt: skip
        system = primary.execute(IDENTITY[0])
        primary.stop("immediate")
        promote(standby)
        standby.execute("INSERT INTO t VALUES (2)")
        assert standby.execute(IDENTITY[0]) == system
        assert standby.execute(IDENTITY[1]) == [("00000002",)]
    finally:
        for cluster in (standby, primary):
            if cluster is not None:
                cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)
