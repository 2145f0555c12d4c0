"""The snapshot under DDL, under hostile server timeouts, and with its secrets kept home.

Live publisher; real local Spark where the copy runs. Each test failed before the guard
(``postgres.snapshot_guard``) and the travelling parameters (``postgres.passfile``, whose own
tests are in ``test_passfile.py``) existed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_pglogrepl.exceptions import SnapshotLockError, SnapshotReadError
from airflow_pglogrepl.faults import PAUSE_ENV
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.postgres.snapshot_guard import readers_application_name
from airflow_pglogrepl.spark.snapshot import SnapshotCopy, SnapshotPoint
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.drain import lake_table, source_table
from tests.support.sources import Source, database_of_its_own

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion


@pytest.fixture
def src(publisher: PgCluster) -> Iterator[Source]:
    with database_of_its_own(publisher, "guard", "guard_pub") as source:
        source.sql(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, pad text NOT NULL);"
            "INSERT INTO t SELECT g, g, repeat('x', 200) FROM generate_series(1, 6000) g;"
            # holes at the start of the heap: VACUUM FULL moves the later rows into them
            "DELETE FROM t WHERE id <= 3000 AND id % 3 <> 0;"
            "CREATE PUBLICATION guard_pub FOR TABLE t"
        )
        yield source


class _CapturedError(Exception):
    pass


class _CapturingSpark:
    """Enough of a SparkSession for ``SnapshotCopy`` to hand over its task: ``mapInArrow``
    records the function Spark would pickle to the executors, then stops the run."""

    def __init__(self) -> None:
        self.tasks: list[Any] = []
        outer = self

        class Context:
            defaultParallelism = 2  # noqa: N815 (Spark's name)

            def accumulator(self, value: int) -> None:
                return None

            def setJobDescription(self, text: str) -> None:  # noqa: N802
                pass

            def parallelize(self, rows: list[Any], slices: int) -> list[Any]:
                return rows

        class Frame:
            def mapInArrow(self, function: Any, schema: Any) -> None:  # noqa: N802
                outer.tasks.append(function)
                raise _CapturedError

        self.sparkContext = Context()
        self._frame = Frame()

    def createDataFrame(self, rows: Any, schema: str) -> Any:  # noqa: N802
        return self._frame


def _copy(src: Source, lake_root: Path, exported: Any, spark: Any, **options: Any) -> SnapshotCopy:
    """A copy on Spark (the tests pause its tasks, or capture what it ships to them)."""
    hook = DsnReplicationHook(src.dsn)
    options.setdefault("engine", "spark")
    point = SnapshotPoint(exported.slot, exported.consistent_point, exported.snapshot_name)
    return SnapshotCopy(spark=lambda: spark, lake=Lake(str(lake_root), src.slot),
                        reader_params=hook.connection_params(), point=point,
                        publications=[src.publication], **options)  # fmt: skip


def test_the_task_shipped_to_executors_holds_no_password(src: Source, tmp_path: Path) -> None:
    """The copy task, pickled as Spark pickles it, carries no password: the executors read it
    from a 0600 passfile that exists only while the snapshot runs."""
    from pyspark import cloudpickle

    hook = DsnReplicationHook(src.dsn)
    password = hook.connection_params()["password"]
    spark = _CapturingSpark()
    with hook.create_slot_with_snapshot(src.slot, temporary=True) as exported:
        copy = _copy(src, tmp_path / "lake", exported, spark)
        with pytest.raises(_CapturedError):
            copy.run()
    (task,) = spark.tasks
    data = cloudpickle.dumps(task)
    assert password.encode() not in data
    assert "password" not in task.params
    passfile = Path(task.params["passfile"])
    assert not passfile.exists(), "the passfile outlived the snapshot"
    assert task.params["application_name"].startswith("pglogrepl snapshot ")


def _run(copy: SnapshotCopy, results: dict[str, Any]) -> None:
    try:
        results["out"] = copy.run()
    except BaseException as exc:  # surfaced by the test's assertions
        results["error"] = exc


def _start_paused(copy: SnapshotCopy, results: dict[str, Any], pause_dir: Path) -> threading.Thread:
    """Run the copy in a thread; return once a task waits before a later range."""
    runner = threading.Thread(target=_run, args=(copy, results))
    runner.start()
    deadline = time.monotonic() + 120
    while not any(pause_dir.glob("before_later_range.*")):
        assert runner.is_alive() and time.monotonic() < deadline, results
        time.sleep(0.05)
    return runner


def _waiting_for_lock(src: Source, pid: int) -> bool:
    rows = src.sql("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
    return bool(rows) and rows[0][0] == "Lock"


def _run_ddl(src: Source, statement: str, out: dict[str, Any]) -> None:
    try:
        with src.cluster.connect(src.db) as conn:
            out["pid"] = conn.info.backend_pid
            conn.execute(statement)
            out["done"] = True
    except psycopg.Error as exc:
        out["error"] = exc


@pytest.mark.parametrize("engine", ["spark", "process"])
def test_rewrites_wait_for_the_copy_and_the_state_is_the_consistent_point(
    src: Source, tmp_path: Path, spark: Any, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pause the copy before its later ranges, run VACUUM FULL and a rewriting ALTER TABLE:
    both must wait for the snapshot's lock (without it, VACUUM FULL moved rows across the
    ranges and the ALTER made the rest of the table look empty). Once a reader queues behind
    them they are canceled and reported, and the state is the table at the consistent
    point. On Spark's tasks and on this process's threads alike."""
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    context = spark.sparkContext  # type: ignore[attr-defined]
    if engine == "spark":
        context.environment[PAUSE_ENV] = f"before_later_range:{pause_dir}"
    else:
        monkeypatch.setenv(PAUSE_ENV, f"before_later_range:{pause_dir}")
    hook = DsnReplicationHook(src.dsn)
    results: dict[str, Any] = {}
    ddl: list[tuple[threading.Thread, dict[str, Any]]] = []
    try:
        with hook.create_slot_with_snapshot(src.slot) as exported:
            expected = source_table(src, "t")
            src.sql("INSERT INTO t VALUES (100000, 1, 'after the snapshot')")
            copy = _copy(src, tmp_path / "lake", exported, spark, tasks_per_table=4,
                         rows_per_task=500, engine=engine)  # fmt: skip
            runner = _start_paused(copy, results, pause_dir)
            deadline = time.monotonic() + 120
            # an impostor: a session named like the readers, waiting behind an unrelated lock
            holder = src.cluster.connect(src.db)
            holder.execute("SELECT pg_advisory_lock(42)")
            impostor: dict[str, Any] = {}
            name = readers_application_name(exported.snapshot_name)
            waiting = threading.Thread(
                target=_run_ddl,
                args=(
                    src,
                    f"SET application_name = '{name}'; SELECT pg_advisory_lock(42)",
                    impostor,
                ),
            )
            waiting.start()
            while not (impostor.get("pid") and _waiting_for_lock(src, impostor["pid"])):
                assert time.monotonic() < deadline and "error" not in impostor, impostor
                time.sleep(0.05)
            for statement in ("VACUUM FULL t", "ALTER TABLE t ALTER COLUMN v TYPE bigint"):
                out: dict[str, Any] = {}
                thread = threading.Thread(target=_run_ddl, args=(src, statement, out))
                thread.start()
                ddl.append((thread, out))
                while not (out.get("pid") and _waiting_for_lock(src, out["pid"])):
                    assert "done" not in out, f"{statement} did not wait for the snapshot"
                    assert time.monotonic() < deadline and "error" not in out, out
                    time.sleep(0.05)
            (pause_dir / "go").touch()
            runner.join(timeout=300)
    finally:
        context.environment.pop(PAUSE_ENV, None)
        (pause_dir / "go").touch()
        for thread, _ in ddl:
            thread.join(timeout=60)
    assert "error" not in results, results["error"]
    result = results["out"]
    assert result.committed
    assert lake_table(str(tmp_path / "lake"), "t") == expected
    canceled = {c["pid"] for c in result.to_dict()["ddl_canceled"] if c["canceled"]}
    assert holder.info.backend_pid not in canceled and "error" not in impostor
    holder.close()  # the impostor gets its lock and ends
    waiting.join(timeout=60)
    assert impostor.get("done")
    for _, out in ddl:
        assert "done" not in out, "a rewrite landed while the snapshot copied"
        assert out["pid"] in canceled and isinstance(out["error"], psycopg.errors.QueryCanceled)


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        ("ALTER TABLE t ALTER COLUMN v TYPE bigint", r"public\.t were rewritten.*again"),
        ("TRUNCATE t", r"public\.t were rewritten.*again"),
        ("VACUUM FULL t", r"public\.t were rewritten.*again"),
        # same file: readers would take the columns by today's names (swapped values)
        (
            "ALTER TABLE t RENAME v TO x; ALTER TABLE t RENAME pad TO v; ALTER TABLE t RENAME x"
            " TO pad",
            r"catalog changed.*at the snapshot column public\.t\.2 v,.*Nothing",
        ),
        # copied at the snapshot, but its changes before the ADD are never decoded
        (
            "ALTER PUBLICATION guard_pub ADD TABLE u",
            r"catalog changed.*now member guard_pub:public\.u\. Nothing",
        ),
    ],
)
def test_a_rewrite_or_catalog_change_before_the_lock_is_refused(
    src: Source, tmp_path: Path, spark: Any, statement: str, error: str
) -> None:
    """A change that commits between the snapshot and its lock: the snapshot would read the
    table empty (ALTER, TRUNCATE), moved, with columns swapped, or a table whose earlier
    changes the slot never sends. Refused, nothing copied."""
    src.sql("CREATE TABLE u (id int PRIMARY KEY); INSERT INTO u VALUES (1)")
    hook = DsnReplicationHook(src.dsn)
    with hook.create_slot_with_snapshot(src.slot, temporary=True) as exported:
        src.sql(statement)
        copy = _copy(src, tmp_path / "lake", exported, spark)
        with pytest.raises(SnapshotReadError, match=error):
            copy.run()
    assert not any((tmp_path / "lake").rglob("*.parquet"))


def test_a_held_exclusive_lock_fails_the_snapshot_within_its_timeout(
    src: Source, tmp_path: Path
) -> None:
    """An exclusive lock taken after the slot was created (it assigns a transaction id, so
    the slot's creation waits for one held before) and held: the snapshot gives up within its
    lock timeout and names the session, instead of waiting for ever."""
    hook = DsnReplicationHook(src.dsn)
    with (
        hook.create_slot_with_snapshot(src.slot, temporary=True) as exported,
        src.cluster.connect(src.db, autocommit=False) as blocker,
    ):
        blocker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        pid = blocker.info.backend_pid
        copy = _copy(src, tmp_path / "lake", exported, _CapturingSpark(), lock_timeout_s=0.5)
        began = time.monotonic()
        holder = rf"pid {pid} .*holds it on public\.t\. Nothing"
        with pytest.raises(SnapshotLockError, match=holder):
            copy.run()
        assert time.monotonic() - began < 30
        blocker.rollback()


def test_server_timeouts_do_not_end_a_long_snapshot(
    src: Source, tmp_path: Path, spark: Any
) -> None:
    """A role whose sessions time out after 300 ms (statement, idle, idle in transaction,
    lock): a snapshot whose copy pauses for longer still completes and is exact."""
    role = f"short_{src.db}"
    password = "pw-" + role
    src.sql(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'")
    src.sql(f"GRANT SELECT ON t TO {role}")
    for setting in ("statement_timeout", "idle_in_transaction_session_timeout",
                    "idle_session_timeout", "lock_timeout"):  # fmt: skip
        src.sql(f"ALTER ROLE {role} SET {setting} = 300")
    dsn = f"postgresql://{role}:{password}@{src.cluster.host}:{src.cluster.port}/{src.db}"
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    context = spark.sparkContext  # type: ignore[attr-defined]
    context.environment[PAUSE_ENV] = f"before_later_range:{pause_dir}"
    results: dict[str, Any] = {}
    try:
        hook = DsnReplicationHook(dsn)
        with hook.create_slot_with_snapshot(src.slot, temporary=True) as exported:
            expected = source_table(src, "t")
            point = SnapshotPoint(exported.slot, exported.consistent_point,
                                  exported.snapshot_name)  # fmt: skip
            copy = SnapshotCopy(spark=lambda: spark, lake=Lake(str(tmp_path / "lake"), src.slot),
                                reader_params=hook.connection_params(), point=point,
                                publications=[src.publication], tasks_per_table=4,
                                rows_per_task=500, engine="spark")  # fmt: skip
            runner = _start_paused(copy, results, pause_dir)
            time.sleep(1.0)  # longer than every timeout of the role: that is the test
            (pause_dir / "go").touch()
            runner.join(timeout=300)
    finally:
        context.environment.pop(PAUSE_ENV, None)
        (pause_dir / "go").touch()
        src.sql(f"REVOKE ALL ON t FROM {role}")
    assert "error" not in results, results["error"]
    assert results["out"].committed
    assert lake_table(str(tmp_path / "lake"), "t") == expected
    assert os.environ.get(PAUSE_ENV) is None
