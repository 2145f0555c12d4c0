"""The hook inside real Airflow task runs: ``airflow dags test`` and ``dag.test()``."""

from __future__ import annotations

import json

import pytest

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import airflow_cli, run_dag, xcom_value


@pytest.fixture(autouse=True)
def _migrated(airflow_home: object, publisher_conn_id: str) -> None:
    """Every test here needs the migrated metadata DB and the publisher connection."""


def test_dag_test_cli_runs_the_hook_and_masks_the_password(
    publisher: PgCluster, publisher_conn_id: str
) -> None:
    result = airflow_cli("dags", "test", "pglogrepl_smoke", "-c", json.dumps({"slot": "smoke_cli"}))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Created logical slot smoke_cli" in output
    assert publisher.password not in output
    with pytest.raises(Exception, match="does not exist"):
        PgLogicalReplicationHook(postgres_conn_id=publisher_conn_id).get_slot("smoke_cli")


def test_dag_test_cli_fails_for_a_missing_connection() -> None:
    result = airflow_cli("dags", "test", "pglogrepl_smoke", "-c", '{"conn_id": "nowhere"}')
    assert result.returncode != 0
    assert "nowhere" in result.stdout + result.stderr


def test_dag_test_in_process_pushes_the_slot_record(
    capfd: pytest.CaptureFixture[str], publisher: PgCluster
) -> None:
    run = run_dag("pglogrepl_smoke", {"slot": "smoke_inproc"})
    assert run.state == "success"  # type: ignore[attr-defined]
    record = xcom_value("pglogrepl_smoke", run.run_id, "slot_round_trip")  # type: ignore[attr-defined]
    assert isinstance(record, dict)
    assert record["name"] == "smoke_inproc" and record["plugin"] == "pgoutput"
    assert "/" in record["confirmed_flush_lsn"]
    out, err = capfd.readouterr()
    assert publisher.password not in out + err


def test_dag_test_in_process_reports_failure_through_state() -> None:
    run = run_dag("pglogrepl_smoke", {"slot": 'bad"name'})
    assert run.state == "failed"  # type: ignore[attr-defined]
