"""A major upgrade of the publisher with ``pg_upgrade`` (17 to 18, the binaries the project
fetches), as docs/upgrade.md's runbook does it: writes stopped, the drain caught up, the cluster
upgraded. The upgraded cluster has a system identifier of its own, so the first drain after it
is refused until asked once (``accept_source_change``); then it goes on from the slot
``pg_upgrade`` carried over, and the lake equals the source with no change stored twice."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import LakeFromAnotherSourceError, SlotAheadOfLakeError
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, start_cluster
from airflow_pglogrepl.testing.upgrade import pg_upgrade
from airflow_pglogrepl.testing.wait import wait_until
from tests.pipeline.test_failover import Writer, no_spark
from tests.support.drain import TYPED_TABLE, assert_state_equals_source, drain_only
from tests.support.sources import Source

SLOT, PUBLICATION, TABLE = "drain", "pub", "items"
WINDOW = 1 << 20


def test_a_drain_goes_on_after_pg_upgrade_once_asked(
    pg_bindir_of: Callable[[int], Path], tmp_path: Path
) -> None:
    base = Path(tempfile.mkdtemp(prefix="pglogrepl-upgrade-"))
    os.chmod(base, 0o755)  # (the servers' OS user works in it)
    old = start_cluster("upgrade", base / "old", LOGICAL_SETTINGS, pg_bindir_of(17))
    new: PgCluster | None = None
    lake = str(tmp_path / "lake")
    try:
        old.execute(TYPED_TABLE.format(name=TABLE))
        old.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        old.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false,"
                    " true)", (SLOT,))  # fmt: skip
        source = Source(old, "postgres", SLOT, PUBLICATION)
        with Writer(old, seed=17) as writer:
            wait_until(lambda: writer.commits >= 60, what="the writer's commits")
            drain_only(source, lake, window=WINDOW)  # (under load)
        assert drain_only(source, lake, window=WINDOW).to_dict()["lag_bytes_left"] == 0
        materialize(no_spark, Lake(lake, SLOT))
        new = pg_upgrade(old, pg_bindir_of(18), base / "new")
        position = Lake(lake, SLOT).position()
        upgraded = Source(new, "postgres", SLOT, PUBLICATION)
        with pytest.raises(LakeFromAnotherSourceError, match=r"PostgreSQL 17.*PostgreSQL 18"):
            drain_only(upgraded, lake, window=WINDOW)
        assert Lake(lake, SLOT).position() == position
        # asked once, right after the upgrade, with nothing to drain yet
        accepted = drain_only(upgraded, lake, window=WINDOW, accept_source_change=True)
        assert accepted.incomplete == {}  # (the lake's record of its relations carried over)
        with Writer(new, seed=18) as writer:  # the new cluster's own changes
            wait_until(lambda: writer.commits >= 40, what="commits on the upgraded cluster")
        after = drain_only(upgraded, lake, window=WINDOW)  # unasked
        assert after.to_dict()["changes"] > 0 and after.incomplete == {}
        materialize(no_spark, Lake(lake, SLOT))
        assert_state_equals_source(upgraded, lake, TableRef("public", TABLE))
    finally:
        for cluster in (new, old):
            if cluster is not None:
                cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def test_another_server_with_a_slot_ahead_is_refused_even_when_asked(
    pg_bindir_of: Callable[[int], Path], tmp_path: Path
) -> None:
    """Not an upgrade: another cluster of a later major, with the same database (``postgres``,
    OID 5 in every cluster) and a table of the same name, whose slot of the same name starts
    past the lake. ``accept_source_change`` does not make the changes it never saw appear.
    Before, the database's OID and the later major were enough to drain on."""
    base = Path(tempfile.mkdtemp(prefix="pglogrepl-upgrade-"))
    os.chmod(base, 0o755)
    clusters: list[PgCluster] = []
    lake = str(tmp_path / "lake")
    try:
        for name, major in (("first", 17), ("other", 18)):
            cluster = start_cluster(name, base / name, LOGICAL_SETTINGS, pg_bindir_of(major))
            clusters.append(cluster)
            if name == "other":  # (so its table's OID differs, as it would)
                cluster.execute("CREATE TABLE before_it (x int)")
            cluster.execute(TYPED_TABLE.format(name=TABLE))
            cluster.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        first, other = clusters
        first.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        with Writer(first, seed=1) as writer:
            wait_until(lambda: writer.commits >= 20, what="commits")
        drain_only(Source(first, "postgres", SLOT, PUBLICATION), lake, window=WINDOW)
        other.execute("SELECT pg_switch_wal()")  # (its slot then starts past the lake)
        other.execute("CREATE TABLE pad AS SELECT generate_series(1, 200000) AS x")
        other.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        position = Lake(lake, SLOT).position()
        with pytest.raises(SlotAheadOfLakeError):
            drain_only(Source(other, "postgres", SLOT, PUBLICATION), lake, window=WINDOW,
                       accept_source_change=True)  # fmt: skip
        assert Lake(lake, SLOT).position() == position
    finally:
        for cluster in clusters:
            cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)
