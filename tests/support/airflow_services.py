"""A real Airflow for one test: api-server, scheduler, dag-processor and triggerer, each a
process group of its own on a fresh metadata database, stopped together however the test ends.

Why: ``airflow dags test`` (``tests/support/airflow.py``) runs one DAG run in one process, with
no scheduler to create runs from Asset events and no triggerer to run an ``AssetWatcher``'s
trigger. A DAG scheduled on events is exercised only with all of them running, as a deployment
runs them. The metadata database is SQLite, which LocalExecutor accepts (``airflow standalone``
runs on it too); the LocalExecutor's task processes reach the metadata through the api-server's
execution API, so the api-server runs too, on a free loopback port. The tests read what the
services did (runs, XComs) from the database file with ``sqlite3``: Airflow's own models in the
test's process are bound to the session's Airflow home, not this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_pglogrepl.testing.pgcluster import free_port
from airflow_pglogrepl.testing.wait import wait_until

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")


def service_environment(home: Path, dags: Path, port: int) -> dict[str, str]:
    """Airflow's settings for the services: this home and database, these DAGs unpaused, the
    execution API on ``port``, and short loops (the defaults wait up to 5 s between steps)."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
        # the scheduler's and the triggerer's log servers: free ports, not the fixed defaults
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        # the services' own executable first: task processes and their applications find it
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }


@dataclass(frozen=True)
class Run:
    """One DAG run as the metadata database has it."""

    run_id: str
    run_type: str  # manual, scheduled, asset_triggered ...
    state: str | None  # queued, running, success, failed


class AirflowServices:
    """The four services of one Airflow home, started by ``start`` and ended by ``stop``
    (use ``running_airflow``, which stops them on any exit)."""

    def __init__(self, home: Path, dags: Path, env: Mapping[str, str]) -> None:
        self.home = home
        self.port = free_port()
        self.env = {**os.environ, **service_environment(home, dags, self.port), **env}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def cli(self, *args: str, timeout: float = 120) -> str:
        """Run the ``airflow`` CLI on this home; its output, or AssertionError when it fails."""
        done = subprocess.run([sys.executable, "-m", "airflow", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout,
                              check=False)  # fmt: skip
        assert done.returncode == 0, f"airflow {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout

    def start(self) -> None:
        """Migrate the database, then start the services, each in a session (process group)
        of its own so that ``stop`` ends it with whatever it started."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.cli("db", "migrate")
        for name in SERVICES:
            with self.log_path(name).open("wb") as log:
                self.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "airflow", name], env=self.env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM each service's process group, then SIGKILL what is left after ``grace``
        seconds: the groups, and any descendant that started a session of its own (the
        worker's applications do)."""
        import psutil

        descendants: list[psutil.Process] = []
        for process in self.processes.values():
            with contextlib.suppress(psutil.Error):
                descendants += psutil.Process(process.pid).children(recursive=True)
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                child.kill()

    def log_path(self, name: str) -> Path:
        return self.home / f"{name}.log"

    def log(self, name: str) -> str:
        """What a service has written so far (stdout and stderr)."""
        return self.log_path(name).read_text(errors="replace")

    def alive(self) -> None:
        """AssertionError naming a service that ended, with the end of its log."""
        for name, process in self.processes.items():
            code = process.poll()
            assert code is None, f"airflow {name} exited ({code}):\n{self.log(name)[-4000:]}"

    def query(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read on the metadata database (``timeout``: a service may hold its lock)."""
        with contextlib.closing(sqlite3.connect(self.home / "airflow.db", timeout=30)) as db:
            return db.execute(statement, params).fetchall()

    def runs(self, dag_id: str) -> list[Run]:
        """The DAG's runs, oldest first."""
        rows = self.query("SELECT run_id, run_type, state FROM dag_run WHERE dag_id = ? "
                          "ORDER BY id", (dag_id,))  # fmt: skip
        return [Run(*row) for row in rows]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        rows = self.query("SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND "
                          "task_id = ? AND key = ?", (dag_id, run_id, task_id, key))  # fmt: skip
        assert rows, f"no XCom {key!r} of {dag_id}.{task_id} in {run_id}"
        return json.loads(rows[0][0])

    def triggering_events(self, dag_id: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """``(Asset URI, extra)`` of each Asset event the run was created for."""
        rows = self.query(
            "SELECT a.uri, e.extra FROM dag_run r JOIN dagrun_asset_event l ON l.dag_run_id = r.id"
            " JOIN asset_event e ON e.id = l.event_id JOIN asset a ON a.id = e.asset_id"
            " WHERE r.dag_id = ? AND r.run_id = ? ORDER BY e.id", (dag_id, run_id)
        )  # fmt: skip
        return [(uri, json.loads(extra)) for uri, extra in rows]

    def task_logs(self, dag_id: str, run_id: str) -> str:
        """The run's task logs, for a failure's message."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(folder.rglob("*.log")))  # fmt: skip

    def finished(self, dag_id: str, run_id: str, timeout: float = 120) -> Run:
        """The run once it ended; AssertionError with its task logs unless it succeeded."""

        def ended() -> Run | None:
            self.alive()
            run = next((r for r in self.runs(dag_id) if r.run_id == run_id), None)
            return run if run is not None and run.state in ("success", "failed") else None

        run = wait_until(ended, timeout=timeout, what=f"{dag_id} run {run_id} to end")
        assert run.state == "success", f"{run}:\n{self.task_logs(dag_id, run_id)}"
        return run


@contextlib.contextmanager
def running_airflow(home: Path, dags: Path, env: Mapping[str, str]) -> Iterator[AirflowServices]:
    """The services of a new Airflow home on ``dags``, with ``env`` over the test's
    environment (connections, the DAGs' settings); stopped on any exit."""
    services = AirflowServices(home, dags, env)
    try:
        services.start()
        yield services
    finally:
        services.stop()
