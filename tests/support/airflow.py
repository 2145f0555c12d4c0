"""An isolated Airflow for the tests: its environment, connections through the environment,
the ``airflow`` CLI, in-process DAG runs and their XComs, and a stand-in TaskInstance.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import TESTS


def airflow_environment(home: Path) -> dict[str, str]:
    """Environment for an isolated Airflow: SQLite metadata DB, our test DAGs, no examples."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(TESTS / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW__API_AUTH__JWT_SECRET": "pglogrepl-tests-only-secret-0123456789abcdef",
    }


def set_airflow_connection(conn_id: str, uri: str) -> None:
    """Define an Airflow connection through the environment (AIRFLOW_CONN_<ID>)."""
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = uri


def airflow_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run the ``airflow`` CLI with the session's environment."""
    return subprocess.run(
        [sys.executable, "-m", "airflow", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=timeout,
        check=False,
    )


def run_dag(dag_id: str, conf: dict[str, object] | None = None) -> object:
    """Run a DAG from the dags folder in-process with ``dag.test()``; return its DagRun.

    ``dag.test()`` reports a failed run through the returned DagRun's state rather than by
    raising, so callers assert ``run.state``.
    """
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag(dag_id)
    assert dag is not None, (
        f"DAG {dag_id!r} not found in {os.environ['AIRFLOW__CORE__DAGS_FOLDER']}"
    )
    return dag.test(run_conf=conf or {})


def xcom_value(dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> object:
    """An XCom value a run pushed, read from the metadata database."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == task_id,
                XComModel.key == key,
            )
        ).all()
    assert rows, f"no XCom {key!r} from {dag_id}.{task_id} in run {run_id}"
    return rows[0][0]


class FakeTI:
    """Just enough of a TaskInstance for operators that push and pull XCom."""

    def __init__(self, previous: Any = None) -> None:
        self.pushed: dict[str, Any] = {}
        self.previous = previous

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, **kwargs: Any) -> Any:
        return self.previous


def context(ti: FakeTI | None = None) -> Any:
    return {"ti": ti or FakeTI()}
