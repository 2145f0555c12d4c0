"""The cutover DAG through ``airflow dags test`` while pgbench writes to the old primary."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, local_cluster
from tests.support.airflow import set_airflow_connection
from tests.support.paths import REPO

DAG_ID = "pglogrepl_cutover"
_ids = itertools.count(1)

SCHEMA = """
CREATE TABLE accounts (id bigserial PRIMARY KEY, balance bigint NOT NULL, note text);
CREATE TABLE history (hid bigserial PRIMARY KEY, account bigint, delta int,
                      at timestamptz DEFAULT now());
"""
LOAD = """\\set id random(1, 2000)
\\set delta random(-500, 500)
UPDATE accounts SET balance = balance + :delta WHERE id = :id;
INSERT INTO history (account, delta) VALUES (:id, :delta);
"""


@dataclass
class Move:
    publisher: PgCluster
    subscriber: PgCluster
    db: str
    role: str
    password: str

    def conf(self, **extra: Any) -> dict[str, Any]:
        return {
            "publisher_conn_id": f"{self.db}_old",
            "subscriber_conn_id": f"{self.db}_new",
            "publication": f"{self.db}_pub",
            "subscription": f"{self.db}_sub",
            "tables": ["public.accounts", "public.history"],
            "fence_roles": [self.role],
            "require_approval": False,
            "sequence_margin": 100,
            **extra,
        }


@pytest.fixture
def move(publisher: PgCluster, subscriber: PgCluster) -> Iterator[Move]:
    """Same schema on both sides, data and an application role on the old primary."""
    yield from _move(publisher, subscriber)


@pytest.fixture(scope="module")
def newest_major(pg_bindir_of: Callable[[int], Path]) -> Iterator[PgCluster]:
    """A PostgreSQL 18 server: the new primary of a major-version upgrade."""
    with local_cluster("new-major", LOGICAL_SETTINGS, bindir=pg_bindir_of(18)) as cluster:
        yield cluster


@pytest.fixture
def upgrade(publisher: PgCluster, newest_major: PgCluster) -> Iterator[Move]:
    """The move from the session's server (PostgreSQL 15 in CI) to PostgreSQL 18."""
    yield from _move(publisher, newest_major)


def _move(publisher: PgCluster, subscriber: PgCluster) -> Iterator[Move]:
    n = next(_ids)
    db = f"cut{n}"
    role, password = f"cut{n}_app", f"pw-{os.urandom(6).hex()}"
    for cluster in (publisher, subscriber):
        cluster.create_database(db)
        with cluster.connect(db) as conn:
            conn.execute(SCHEMA)
    publisher.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    with publisher.connect(db) as conn:
        conn.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(
            sql.Identifier(role)))  # fmt: skip
        conn.execute(sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(
            sql.Identifier(role)))  # fmt: skip
        conn.execute("INSERT INTO accounts (balance) SELECT 1000 FROM generate_series(1, 2000)")
        # Watches every change on the old primary from here on, to check the fence afterwards.
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (db,))
    set_airflow_connection(f"{db}_old", publisher.airflow_uri(db))
    set_airflow_connection(f"{db}_new", subscriber.airflow_uri(db))
    yield Move(publisher, subscriber, db, role, password)
    publisher.execute("SELECT pg_drop_replication_slot(%s)", (db,))


def pgbench_load(move: Move, tmp_path: Path) -> subprocess.Popen[str]:
    script = tmp_path / "load.sql"
    script.write_text(LOAD)
    cluster = move.publisher
    return subprocess.Popen(
        [str(cluster.bindir / "pgbench"), "-n", "-c", "2", "-T", "600", "-R", "100",
         "-f", str(script), "-h", cluster.host, "-p", str(cluster.port), "-U", move.role,
         move.db],
        env={**os.environ, "PGPASSWORD": move.password},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def cutover_under_load(
    move: Move, tmp_path: Path, pg_tool: Callable[[str], Path]
) -> dict[str, tuple[str, Any]]:
    """The DAG run to its end while pgbench writes to the old primary; the task states."""
    pg_tool("pgbench")
    load = pgbench_load(move, tmp_path)
    try:
        result = dags_test(move.conf())
    finally:
        load.terminate()
        load.wait(timeout=30)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    return task_states()


def dags_test(conf: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "test", DAG_ID, "-c", json.dumps(conf)],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "PGLOGREPL_FENCE_GRACE_S": "2",
            "PGLOGREPL_GATE_TIMEOUT_S": "300",
        },
        timeout=900,
        check=False,
    )


def task_states() -> dict[str, tuple[str, Any]]:
    """State and return value of every task in the DAG's newest run."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalars(
            select(DagRun).where(DagRun.dag_id == DAG_ID).order_by(DagRun.id.desc()).limit(1)
        ).one()
        out: dict[str, tuple[str, Any]] = {}
        for ti in session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == run.run_id
            )
        ):
            value = session.scalars(
                select(XComModel.value).where(
                    XComModel.dag_id == DAG_ID,
                    XComModel.run_id == run.run_id,
                    XComModel.task_id == ti.task_id,
                    XComModel.key == "return_value",
                )
            ).first()
            out[ti.task_id] = (str(ti.state), value)
        return out


def test_cutover_under_write_load(
    airflow_home: Path, move: Move, tmp_path: Path, pg_tool: Callable[[str], Path]
) -> None:
    states = cutover_under_load(move, tmp_path, pg_tool)
    assert states["release_fence"][0] == "skipped"
    assert states["approval_not_required"][0] == "success"
    summary = states["cutover_summary"][1]
    assert summary["outcome"] == "switched" and summary["parity_passed"] is True, summary
    assert 0 < summary["write_downtime_seconds"] < 600, summary
    assert summary["fence_lsn"] == states["write_fence"][1]["fence_lsn"]
    assert states["approve_cutover"][0] == "skipped"
    parity = states["parity_check"][1]
    assert parity["passed"] and parity["checked"] == 2, parity
    fence_lsn = states["write_fence"][1]["fence_lsn"]
    # writes really happened during the run, and none on the old primary after the fence
    changes = move.publisher.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL) "
        "WHERE data LIKE 'table %%'",
        (move.db,),
        dbname=move.db,
    )
    after = move.publisher.execute(
        "SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL) "
        "WHERE data LIKE 'table %%' AND lsn > %s::pg_lsn",
        (move.db, fence_lsn),
        dbname=move.db,
    )
    # (the slot was created after the initial rows: these are the load's writes)
    assert len(changes) > 100 and after == [(0,)], (len(changes), after)
    history = move.publisher.execute("SELECT count(*) FROM history", dbname=move.db)[0][0]
    assert history > 0
    # sequences on the new primary are at or above the old primary's
    for seq in ("accounts_id_seq", "history_hid_seq"):
        old = move.publisher.execute(f"SELECT last_value FROM {seq}", dbname=move.db)[0][0]
        new = move.subscriber.execute(f"SELECT last_value FROM {seq}", dbname=move.db)[0][0]
        assert new >= old, (seq, old, new)
    # finalized: no subscription left, its slot gone from the old primary
    subs = move.subscriber.execute("SELECT subname FROM pg_subscription")
    assert (f"{move.db}_sub",) not in subs
    slots = move.publisher.execute("SELECT slot_name FROM pg_replication_slots")
    assert all(not name.startswith(f"{move.db}_sub") for (name,) in slots), slots
    # and every other slot (a lake's drain, here the test's own) is left as it was
    assert (move.db,) in slots, slots


@pytest.mark.pgversion
def test_parity_failure_stops_before_finalize_and_releases_the_fence(
    airflow_home: Path, move: Move
) -> None:
    # A row only the new primary has: the table sync keeps it, parity must catch it.
    move.subscriber.execute(
        "INSERT INTO accounts (id, balance, note) VALUES (-1, 0, 'planted')", dbname=move.db
    )
    result = dags_test(move.conf())
    assert result.returncode != 0
    states = task_states()
    assert states["parity_check"][0] == "failed"
    assert states["finalize"][0] == "upstream_failed"
    assert states["release_fence"][0] == "success"
    assert states["cutover_summary"][0] == "failed"
    summary = states["cutover_summary"][1]
    assert summary["outcome"].startswith("fenced, then rolled back"), summary
    assert summary["write_downtime_seconds"] is None and summary["parity_passed"] is False
    parity = states["parity_check"][1]
    assert parity["differing"] == ["public.accounts"], parity
    assert parity["tables"][0]["row_difference"] == 1
    # the fence is gone: the application role writes again on the old primary
    import psycopg

    params = {**move.publisher.params(move.db), "user": move.role, "password": move.password}
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("INSERT INTO history (account, delta) VALUES (1, 1)")
    # nothing was dropped: the subscription still exists on the new primary
    subs = move.subscriber.execute("SELECT subname FROM pg_subscription")
    assert (f"{move.db}_sub",) in subs
    move.subscriber.execute(
        sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(sql.Identifier(f"{move.db}_sub")),
        dbname=move.db,
    )
    move.subscriber.execute(
        sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(f"{move.db}_sub")), dbname=move.db
    )


def test_major_version_upgrade_under_write_load(
    airflow_home: Path, upgrade: Move, tmp_path: Path, pg_tool: Callable[[str], Path]
) -> None:
    """The cutover DAG as a major-version upgrade: the old primary on the session's server
    (15), the new one on 18, pgbench writing throughout. Parity must be equal, and the summary
    says the versions and the write downtime (fence to switch)."""
    states = cutover_under_load(upgrade, tmp_path, pg_tool)
    parity = states["parity_check"][1]
    assert parity["passed"] and parity["checked"] == 2, parity
    summary = states["cutover_summary"][1]
    old_major = upgrade.publisher.execute("SHOW server_version")[0][0]
    assert summary["old_primary_version"] == old_major
    assert summary["new_primary_version"].startswith("18."), summary
    assert summary["outcome"] == "switched" and 0 < summary["write_downtime_seconds"] < 600
    # the load really wrote through the move, and nothing after the fence on the old primary
    fence_lsn = summary["fence_lsn"]
    written, after = upgrade.publisher.execute(
        "SELECT count(*), count(*) FILTER (WHERE lsn > %s::pg_lsn)"
        " FROM pg_logical_slot_peek_changes(%s, NULL, NULL) WHERE data LIKE 'table %%'",
        (fence_lsn, upgrade.db),
        dbname=upgrade.db,
    )[0]
    assert written > 100 and after == 0, (written, after)
    for seq in ("accounts_id_seq", "history_hid_seq"):
        old = upgrade.publisher.execute(f"SELECT last_value FROM {seq}", dbname=upgrade.db)[0][0]
        new = upgrade.subscriber.execute(f"SELECT last_value FROM {seq}", dbname=upgrade.db)
        assert new[0][0] >= old, (seq, old, new)
    print(f"\n{summary['text']}")  # the measured downtime, for the runbook (pytest -s)
