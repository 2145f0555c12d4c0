"""A publisher failover: a primary with a streaming standby, the drain's slot a failover slot
synchronized to it (PostgreSQL 17+), a writer running, the primary stopped with ``-m
immediate`` and the standby promoted. The drain pointed at the new primary goes on without a
person: the lake equals the source, and no change is stored twice. When the primary let the
drain confirm WAL the standby never received, the run fails naming the fix, and nothing moves.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_pglogrepl.exceptions import (
    LakePastFailoverError,
    SlotGoneUnderLakeError,
    StandbyNotConfirmingError,
)
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.operators.slots import SlotHealthCheckOperator
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, start_cluster
from airflow_pglogrepl.testing.standby import promote, start_standby, synced
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.airflow import FakeTI, context, set_airflow_connection
from tests.support.drain import TYPED_TABLE, assert_state_equals_source, drain_only, random_row
from tests.support.sources import Source

pytestmark = pytest.mark.pgversion

SLOT, PUBLICATION, TABLE = "drain", "pub", "items"
WINDOW = 1 << 20


def no_spark() -> Any:
    raise AssertionError("a merge of this workload needed Spark")


@pytest.fixture
def pair(
    request: pytest.FixtureRequest, pg_bindir: Path, pg_bindir_of: Callable[[int], Path],
    tmp_path: Path,
) -> Iterator[tuple[PgCluster, PgCluster]]:  # fmt: skip
    """A primary and its standby; ``hold_back`` (the test's parameter, default True): the
    primary holds a failover slot's consumers back to what the standby has."""
    base = Path(tempfile.mkdtemp(prefix="pglogrepl-failover-"))
    os.chmod(base, 0o755)  # (the servers' OS user works in it)
    primary = start_cluster("failover", base / "primary", LOGICAL_SETTINGS, pg_bindir)
    standby: PgCluster | None = None
    try:
        major = int(primary.execute("SHOW server_version_num")[0][0]) // 10000
        if major < 17:
            pytest.skip(f"failover slots need PostgreSQL 17; this run's server is {major}")
        basebackup = pg_bindir / "pg_basebackup"
        if not basebackup.is_file():  # (18's backs up an older server)
            basebackup = pg_bindir_of(18) / "pg_basebackup"
        primary.execute(TYPED_TABLE.format(name=TABLE))
        primary.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        standby = start_standby(primary, base / "standby", basebackup=basebackup,
                                hold_back=getattr(request, "param", True))  # fmt: skip
        primary.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false,"
                        " true)", (SLOT,))  # fmt: skip
        wait_until(lambda: synced(standby, SLOT), what=f"slot {SLOT} synchronized")  # type: ignore[arg-type]
        yield primary, standby
    finally:
        for cluster in (standby, primary):
            if cluster is not None:
                cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


class Writer:
    """Random inserts, updates and deletes in small transactions until stopped, or until the
    server goes (the primary stopped under it)."""

    def __init__(self, cluster: PgCluster, seed: int) -> None:
        self.cluster, self.rng = cluster, random.Random(seed)
        self.keys = int(cluster.execute(f"SELECT coalesce(max(id), 0) FROM {TABLE}")[0][0])
        self.commits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        columns = ", ".join(["%s"] * 14)
        try:
            with self.cluster.connect() as conn:
                while not self._stop.is_set():
                    with conn.transaction():
                        for _ in range(self.rng.randrange(1, 6)):
                            self._one(conn, columns)
                    self.commits += 1
        except psycopg.OperationalError:
            return  # the server went

    def _one(self, conn: Any, columns: str) -> None:
        roll = self.rng.random()
        if roll < 0.6 or self.keys < 10:
            self.keys += 1
            conn.execute(f"INSERT INTO {TABLE} VALUES ({columns})",
                         random_row(self.rng, self.keys))  # fmt: skip
        elif roll < 0.85:
            key = self.rng.randrange(1, self.keys)
            conn.execute(f"UPDATE {TABLE} SET i = %s, t = %s WHERE id = %s",
                         (self.rng.randrange(1000), "upd", key))  # fmt: skip
        else:
            conn.execute(f"DELETE FROM {TABLE} WHERE id = %s",
                         (self.rng.randrange(1, self.keys),))  # fmt: skip


class BothServers(Source):
    """The pair through one multi-host connection string that goes to whichever is the
    primary (``target_session_attrs=read-write``): the drain's connection never changes."""

    def __init__(self, cluster: PgCluster, pair: tuple[PgCluster, PgCluster]) -> None:
        super().__init__(cluster, "postgres", SLOT, PUBLICATION)
        self.pair = pair

    @property
    def dsn(self) -> str:
        primary, standby = self.pair
        return (f"postgresql://{primary.superuser}:{primary.password}@{primary.host}:"
                f"{primary.port},{standby.host}:{standby.port}/postgres"
                f"?target_session_attrs=read-write")  # fmt: skip


def confirmed(source: Source) -> list[tuple[Any, ...]]:
    """The drain's slot's confirmed position on ``source``: what a refused run must not move."""
    return source.sql("SELECT confirmed_flush_lsn FROM pg_replication_slots"
                      " WHERE slot_name = %s", (SLOT,))  # fmt: skip


def drain_and_merge(source: Source, lake_root: str) -> dict[str, Any]:
    result = drain_only(source, lake_root, window=WINDOW).to_dict()
    materialize(no_spark, Lake(lake_root, SLOT))
    return result


def failover_check(primary: PgCluster, standby: PgCluster) -> dict[str, Any]:
    """``SlotHealthCheckOperator`` with the standby: the failover verdict it pushed."""
    set_airflow_connection("failover_primary", primary.airflow_uri())
    set_airflow_connection("failover_standby", standby.airflow_uri())
    ti = FakeTI()
    try:
        record = SlotHealthCheckOperator(
            task_id="h", slot_name=SLOT, postgres_conn_id="failover_primary",
            standby_conn_ids=["failover_standby"],
        ).execute(context(ti))  # fmt: skip
    except Exception as exc:  # (a failed check pushes the record)
        assert "slot health check failed" in str(exc)
        record = ti.pushed["return_value"]
    verdict: dict[str, Any] = record["failover"]
    return verdict


def test_the_health_check_sees_whether_the_standby_synchronizes_the_slot(
    pair: tuple[PgCluster, PgCluster],
) -> None:
    primary, standby = pair
    verdict = failover_check(primary, standby)
    assert verdict["ready"] is True and verdict["problems"] == [], verdict
    assert verdict["standbys_ready"] == [f"{standby.host}:{standby.port}"]
    standby.execute("ALTER SYSTEM SET sync_replication_slots = off")
    standby.execute("SELECT pg_reload_conf()")
    wait_until(lambda: standby.execute("SHOW sync_replication_slots") == [("off",)],
               what="the standby's reload")  # fmt: skip
    verdict = failover_check(primary, standby)
    assert verdict["ready"] is False
    assert any("sync_replication_slots is off" in p for p in verdict["problems"]), verdict


def test_a_drain_goes_on_through_a_promotion_exactly_once(
    pair: tuple[PgCluster, PgCluster], tmp_path: Path
) -> None:
    primary, standby = pair
    lake = str(tmp_path / "lake")
    # The synchronized copy follows the primary's slot every 0.2 to 30 s; here it stays where it
    # was created, behind everything the drain confirms (a failover inside that lag).
    standby.execute("ALTER SYSTEM SET sync_replication_slots = off")
    standby.execute("SELECT pg_reload_conf()")
    with Writer(primary, seed=45) as writer:
        wait_until(lambda: writer.commits >= 50, what="the writer's first commits")
        drain_and_merge(BothServers(primary, pair), lake)
        wait_until(lambda: writer.commits >= 100, what="more commits after the drain")
        primary.stop("immediate")  # mid-workload
    (behind,) = standby.execute(
        "SELECT confirmed_flush_lsn < %s::pg_lsn FROM pg_replication_slots"
        " WHERE slot_name = %s AND synced", (str(Lake(lake, SLOT).position()), SLOT))  # fmt: skip
    assert behind == (True,)
    promote(standby)
    new = BothServers(standby, pair)  # the same connection string, now reaching the standby
    result = drain_and_merge(new, lake)  # no accept_source_change, no person
    assert result["changes"] > 0
    assert_state_equals_source(new, lake, TableRef("public", TABLE))
    with Writer(standby, seed=46) as writer:  # the new primary's own changes, after
        wait_until(lambda: writer.commits >= 30, what="commits on the new primary")
    drain_and_merge(new, lake)
    assert_state_equals_source(new, lake, TableRef("public", TABLE))
    identity = Lake(lake, SLOT).recorded_source()
    assert identity is not None and identity["timeline"] == 2


@pytest.mark.parametrize("pair", [False], indirect=True)
def test_a_promotion_that_lost_what_the_lake_holds_fails_naming_the_fix(
    pair: tuple[PgCluster, PgCluster], tmp_path: Path
) -> None:
    """Without ``synchronized_standby_slots`` the drain confirmed WAL the standby (stopped
    meanwhile) never received: the promoted server's own commits would take those LSNs."""
    primary, standby = pair
    lake = str(tmp_path / "lake")
    verdict = failover_check(primary, standby)  # said before it happens
    assert any("synchronized_standby_slots is empty" in p for p in verdict["problems"]), verdict
    standby.stop("fast")
    with Writer(primary, seed=47) as writer:
        wait_until(lambda: writer.commits >= 50, what="commits the standby never gets")
    drain_and_merge(Source(primary, "postgres", SLOT, PUBLICATION), lake)
    position = Lake(lake, SLOT).position()
    primary.stop("immediate")
    standby.start()
    promote(standby)
    new = Source(standby, "postgres", SLOT, PUBLICATION)
    before = confirmed(new)
    with pytest.raises(LakePastFailoverError, match=r"new initial snapshot.*synchronized_standby"):
        drain_only(new, lake, window=WINDOW)
    after = confirmed(new)
    assert after == before and Lake(lake, SLOT).position() == position


def test_a_promotion_that_lost_the_slot_fails_naming_a_new_snapshot(
    pair: tuple[PgCluster, PgCluster], tmp_path: Path
) -> None:
    """The drain's slot not a failover slot: the standby holds no copy, and after the
    promotion the slot is gone. The run fails naming the promotion and the fix; nothing moves,
    and no slot is created for it."""
    primary, standby = pair
    lake = str(tmp_path / "lake")
    primary.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
    primary.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    wait_until(lambda: not standby.execute("SELECT 1 FROM pg_replication_slots"
                                           " WHERE slot_name = %s", (SLOT,)),
               what="the standby's synchronized copy dropped")  # fmt: skip
    verdict = failover_check(primary, standby)
    assert any("not a failover slot" in p for p in verdict["problems"]), verdict
    with Writer(primary, seed=48) as writer:
        wait_until(lambda: writer.commits >= 50, what="the writer's first commits")
        drain_and_merge(Source(primary, "postgres", SLOT, PUBLICATION), lake)
        primary.stop("immediate")
    position = Lake(lake, SLOT).position()
    promote(standby)
    new = Source(standby, "postgres", SLOT, PUBLICATION)
    with pytest.raises(SlotGoneUnderLakeError, match=r"was promoted.*new initial snapshot"):
        drain_only(new, lake, window=WINDOW)
    assert Lake(lake, SLOT).position() == position
    assert new.sql("SELECT slot_name FROM pg_replication_slots") == []


def test_a_drain_whose_standby_is_away_is_refused_instead_of_waiting(
    pair: tuple[PgCluster, PgCluster], tmp_path: Path
) -> None:
    """A failover slot's reads wait for the standbys ``synchronized_standby_slots`` names.
    Before, a run with the standby stopped hung in WaitForStandbyConfirmation, silently, with
    the lake's lock held. Now it fails at once, naming the standby's slot and the fix; the
    health check names it too, and an upper-case name in the setting is the same slot."""
    primary, standby = pair
    lake = str(tmp_path / "lake")
    primary.execute("ALTER SYSTEM SET synchronized_standby_slots = 'STANDBY_1'")
    primary.execute("SELECT pg_reload_conf()")
    wait_until(lambda: primary.execute("SHOW synchronized_standby_slots") == [("STANDBY_1",)],
               what="the primary's reload")  # fmt: skip
    assert failover_check(primary, standby)["ready"] is True
    standby.stop("fast")
    verdict = failover_check(primary, standby)
    assert any("no standby streams through 'standby_1'" in p for p in verdict["problems"])
    assert any("could not be checked" in p for p in verdict["problems"])
    assert not any("no standby was checked" in p for p in verdict["problems"]), verdict
    with Writer(primary, seed=49) as writer:
        wait_until(lambda: writer.commits >= 20, what="commits while the standby is away")
    new = Source(primary, "postgres", SLOT, PUBLICATION)
    before = confirmed(new)
    with pytest.raises(StandbyNotConfirmingError, match=r"\['standby_1'\]"):
        drain_only(new, lake, window=WINDOW)
    after = confirmed(new)
    assert after == before and Lake(lake, SLOT).position() is None
