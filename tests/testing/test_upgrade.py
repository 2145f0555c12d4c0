"""``testing.upgrade.pg_upgrade`` from 17 to 18 with the binaries the project fetches: a
caught-up logical slot comes along (its failover flag kept, created again at the new cluster's
position, past the old one's end), on a new system identifier; a slot that has not consumed its
WAL stops the upgrade before anything is changed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from psycopg import sql

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, ClusterError, start_cluster
from airflow_pglogrepl.testing.upgrade import pg_upgrade

_SLOT = "SELECT slot_name, plugin, failover, confirmed_flush_lsn FROM pg_replication_slots"
_IDENTITY = "SELECT system_identifier::text FROM pg_control_system()"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pglogrepl-upgrade-"))
    os.chmod(path, 0o755)  # (the servers' OS user works in it)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_caught_up_slot_comes_through_pg_upgrade(
    base: Path, pg_bindir_of: Callable[[int], Path]
) -> None:
    old = start_cluster("upgrade", base / "old", LOGICAL_SETTINGS, pg_bindir_of(17))
    new = None
    try:
        old.execute("CREATE TABLE t (id int PRIMARY KEY)")
        old.execute("CREATE PUBLICATION p FOR TABLE t")
        old.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, false, "
                    "true)")  # fmt: skip
        old.execute("INSERT INTO t SELECT generate_series(1, 100)")
        (end,) = old.execute("SELECT pg_current_wal_lsn()")[0]
        old.execute("SELECT pg_replication_slot_advance('s', %s)", (end,))
        (system,) = old.execute(_IDENTITY)[0]
        new = pg_upgrade(old, pg_bindir_of(18), base / "new")
        assert int(new.execute("SHOW server_version_num")[0][0]) // 10000 == 18
        ((name, plugin, failover, confirmed),) = new.execute(_SLOT)
        assert (name, plugin, failover) == ("s", "pgoutput", True)
        assert LSN(confirmed) > LSN(end)  # the new cluster's WAL goes on past the old one's
        assert new.execute(_IDENTITY)[0][0] != system
        assert new.execute("SELECT count(*) FROM t") == [(100,)]
    finally:
        for cluster in (new, old):
            if cluster is not None:
                cluster.stop("immediate")


def test_a_slot_that_has_not_consumed_its_wal_stops_the_upgrade(
    base: Path, pg_bindir_of: Callable[[int], Path]
) -> None:
    old = start_cluster("upgrade", base / "old", LOGICAL_SETTINGS, pg_bindir_of(17))
    try:
        old.execute("CREATE TABLE t (id int PRIMARY KEY)")
        old.execute(sql.SQL("SELECT pg_create_logical_replication_slot('s', 'pgoutput')"))
        old.execute("INSERT INTO t SELECT generate_series(1, 100)")
        with pytest.raises(ClusterError, match="logical replication slots"):
            pg_upgrade(old, pg_bindir_of(18), base / "new")
        old.start()  # (--check found it: the old cluster is untouched)
        assert old.execute("SELECT slot_name FROM pg_replication_slots") == [("s",)]
    finally:
        old.stop("immediate")
