"""``SlotDrainOperator`` decides on the worker whether a run needs Spark: a run with nothing to
drain or merge starts no spark-submit and returns what a submitted run would have; any run with
something to do is submitted. spark-submit here is a stand-in that counts its calls and runs the
drain application with this Python (a local lake needs no JVM to drain or to merge small
batches), so a test sees exactly which runs were submitted."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.materialize import pending_tables
from airflow_pglogrepl.operators.drain import SlotDrainOperator
from tests.support.airflow import FakeTI
from tests.support.drains import Drains
from tests.support.sources import Source

# whether a peek finds a change depends on pgoutput (15 skips empty transactions; 18 decodes
# past a missing publication)
pytestmark = pytest.mark.pgversion


@pytest.fixture
def drains(source: Source, tmp_path: Path) -> Drains:
    """A published table ``t`` and an unpublished one ``other``, drained once (3 changes)."""
    source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source.sql("CREATE TABLE other (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3) g")
    d = Drains(source, tmp_path)
    result, pushed = d.run()
    assert d.submits() == 1 and result["changes"] == 3 and result["idle"] is False, result
    assert pushed["confirmed_flush_lsn"] == d.confirmed() == result["confirmed_flush_lsn_after"]
    return d


def test_an_idle_run_starts_no_spark_submit_and_returns_what_a_run_would(drains: Drains) -> None:
    submitted, _ = drains.run(skip_when_idle=False)  # the same run, submitted: its shape
    assert drains.submits() == 2 and submitted["changes"] == 0, submitted
    confirmed = drains.confirmed()

    result, pushed = drains.run()

    assert drains.submits() == 2, "an idle run called spark-submit"
    assert result["idle"] is True and result["spark_start_s"] is None
    assert set(result) == set(submitted), set(result) ^ set(submitted)
    assert (result["windows"], result["transactions"], result["changes"]) == (0, 0, 0)
    assert result["materialized"] == {} and result["tables"] == {}
    assert result["confirmed_flush_lsn_before"] == result["confirmed_flush_lsn_after"] == confirmed
    assert pushed == {
        "confirmed_flush_lsn": confirmed,
        "asset": [
            {"slot": drains.src.slot, "confirmed_flush_lsn": confirmed, "changes": 0, "idle": True}
        ],
        "table_assets": {},  # no table changed
    }
    assert drains.confirmed() == confirmed  # the slot did not move


def test_wal_without_a_published_change_is_idle_until_it_grows_past_the_bound(
    drains: Drains,
) -> None:
    drains.src.sql("INSERT INTO other SELECT g, 'o' || g FROM generate_series(1, 200) g")
    confirmed = drains.confirmed()
    assert drains.flush() > LSN(confirmed)  # WAL moved: the slot is peeked

    result, _ = drains.run()
    assert drains.submits() == 1 and result["idle"] is True and result["lag_bytes_left"] > 0

    # more WAL past the slot than the run may leave: submitted, and the slot moves past it
    result, _ = drains.run(idle_wal_bytes=result["lag_bytes_left"] - 1)
    assert drains.submits() == 2 and result["idle"] is False and result["changes"] == 0
    assert LSN(drains.confirmed()) > LSN(confirmed)
    assert Lake(drains.lake_root, drains.src.slot).position() == LSN(drains.confirmed())


def test_a_published_change_is_submitted_and_drained(drains: Drains) -> None:
    drains.src.sql("INSERT INTO other VALUES (1, 'o')")  # an unpublished change first
    drains.src.sql("UPDATE t SET v = 'changed' WHERE id = 2")
    result, pushed = drains.run()
    assert drains.submits() == 2 and result["idle"] is False and result["changes"] == 1, result
    assert pushed["confirmed_flush_lsn"] == drains.confirmed()


def test_a_run_emits_the_assets_of_exactly_the_tables_it_changed(drains: Drains) -> None:
    """Through the alias among the drain's outlets, each with what the run did in its extra:
    a DAG scheduled on one table's Asset runs after the runs that changed that table."""
    from airflow_pglogrepl.operators.assets import lake_table_asset

    drains.src.sql("CREATE TABLE u (id int PRIMARY KEY, v text)")
    drains.src.sql(f"ALTER PUBLICATION {drains.src.publication} ADD TABLE u")
    drains.src.sql("INSERT INTO u VALUES (1, 'u'), (2, 'u')")
    result, pushed = drains.run(history=["public.u"])
    lake = drains.lake_root
    uris = {lake_table_asset(lake, "public.u", kind).uri: kind
            for kind in ("changes", "state", "history")}  # fmt: skip
    assert set(pushed["table_assets"]) == set(uris), pushed["table_assets"]
    for uri, kind in uris.items():
        extra = pushed["table_assets"][uri]
        assert extra["table"] == "public.u" and extra["kind"] == kind and extra["changes"] == 2
        assert extra["lsn"] == result["confirmed_flush_lsn_after"] == drains.confirmed()
        assert isinstance(extra["delta_version"], int)
    drains.src.sql("UPDATE t SET v = 'changed' WHERE id = 2")
    _, pushed = drains.run(history=["public.u"])  # t has no history: its changes and state
    assert set(pushed["table_assets"]) == {lake_table_asset(lake, "public.t", kind).uri
                                           for kind in ("changes", "state")}  # fmt: skip


def test_changes_waiting_for_their_merge_are_submitted(drains: Drains) -> None:
    drains.src.sql("DELETE FROM t WHERE id = 1")
    drains.run(materialize=False)
    lake = Lake(drains.lake_root, drains.src.slot)
    assert drains.submits() == 2 and pending_tables(lake) == ["public.t"]

    result, _ = drains.run()  # nothing new in the slot, but a merge to do
    assert drains.submits() == 3 and result["idle"] is False, result
    assert result["changes"] == 0 and "public.t" in result["materialized"]
    assert pending_tables(Lake(drains.lake_root, drains.src.slot)) == []
    assert drains.run()[0]["idle"] is True and drains.submits() == 3


def test_a_lake_behind_the_slot_is_left_to_the_application(drains: Drains) -> None:
    # the slot moved on without the lake: the application's to refuse, so it is submitted
    drains.src.sql("UPDATE t SET v = 'lost' WHERE id = 3")
    drains.src.sql(
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())", (drains.src.slot,)
    )
    with pytest.raises(Exception, match="SlotAheadOfLakeError"):
        drains.run()
    assert drains.submits() == 2


def test_a_missing_publication_is_never_idle(drains: Drains) -> None:
    # 18 decodes past a missing publication with only a warning: a peek alone would say idle.
    # The operator's own check refuses it before the idle check or spark-submit.
    drains.src.sql(f"DROP PUBLICATION {drains.src.publication}")
    drains.src.sql("INSERT INTO t VALUES (10, 'unpublished now')")
    with pytest.raises(Exception, match=r"does not exist"):
        drains.run()
    assert drains.submits() == 1


def test_an_error_the_application_reports_is_in_the_task_log_once(
    drains: Drains, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The application's own error reaches the task as ours, once: not also logged by the
    application, nor repeated in a provider exception carrying the output's tail."""
    import logging
    import traceback

    from airflow_pglogrepl.exceptions import SparkApplicationError
    from airflow_pglogrepl.postgres.source import PgSource

    drains.src.sql("INSERT INTO t VALUES (100, 'x')")  # something to do: the run is submitted
    caplog.set_level(logging.DEBUG)
    with (
        PgSource(drains.src.dsn).writer_lock(drains.src.slot, role="snapshot"),
        pytest.raises(SparkApplicationError) as failure,
    ):
        drains.run()

    assert failure.value.error == "LakeWriterBusyError" and failure.value.retryable
    told = "only one drain or snapshot may write it at a time"
    printed = "".join(traceback.format_exception(failure.value))
    captured = capsys.readouterr()
    logged = caplog.text + captured.out + captured.err  # structlog writes the task log to stdout
    assert "Spark-Submit cmd" in logged  # what the task logged is here
    assert printed.count(told) == 1, printed
    assert logged.count(told) == 0, logged
    assert "Cannot execute" not in printed + logged  # the provider's copy is dropped
    assert '{"error"' not in logged  # the summary line is read, not logged


def test_a_lake_another_run_writes_is_never_idle(drains: Drains) -> None:
    # A drain or snapshot of the same lake holds the writer lock: the lake and the slot it is
    # moving are not this run's to judge, and a peek now would hold the slot that run peeks.
    # Submitted, so the application reports the busy lake as it did before the idle check.
    with (
        drains.src.hook().writer_lock(drains.src.slot, role="snapshot"),
        pytest.raises(Exception, match=r"LakeWriterBusyError|writer lock"),
    ):
        drains.run()
    assert drains.submits() == 2
    assert drains.run()[0]["idle"] is True and drains.submits() == 2  # free again: idle


def test_a_slot_holding_wal_from_far_behind_its_confirmed_position_is_never_idle(
    drains: Drains,
) -> None:
    # A transaction open across a drain holds the slot's restart_lsn at its start: that drain
    # advances confirmed_flush_lsn past it, restart_lsn stays. Every peek decodes from
    # restart_lsn, and only an advance moves it, so an idle check that looks only past
    # confirmed_flush_lsn would decode (and pin) that WAL on every run for as long as the
    # publication stays idle.
    import psycopg

    bound = 512 * 1024
    with psycopg.connect(drains.src.dsn) as long_open:
        long_open.execute("INSERT INTO other VALUES (0, 'open across a drain')")  # an xid
        drains.src.sql(
            "INSERT INTO other SELECT g, repeat('x', 1000) FROM generate_series(1, 2000) g"
        )
        assert drains.run(idle_wal_bytes=bound)[0]["idle"] is False  # past the bound: drained
        long_open.commit()
    restart, confirmed = drains.src.sql(
        "SELECT restart_lsn::text, confirmed_flush_lsn::text FROM pg_replication_slots"
        " WHERE slot_name = %s",
        (drains.src.slot,),
    )[0]
    assert LSN(confirmed) - LSN(restart) > bound  # the WAL every peek would decode again
    assert drains.flush() - LSN(confirmed) < bound  # only the commit past confirmed

    result, _ = drains.run(idle_wal_bytes=bound)
    assert result["idle"] is False and drains.submits() == 3, result

    # the transaction is over: once the slot advances past a running-transactions record
    # (a checkpoint logs one; so does the background writer every 15 s, which on a slow
    # machine may have come before the last drain's advance), restart_lsn follows, and the
    # publication is idle again. A run is idle exactly when what restart_lsn holds back fits.
    drains.src.sql("CHECKPOINT")
    (restart,) = drains.src.sql(
        "SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (drains.src.slot,),
    )[0]
    held = drains.flush() - LSN(restart) > bound
    assert drains.run(idle_wal_bytes=bound)[0]["idle"] is not held
    assert drains.submits() == (4 if held else 3)
    assert drains.run(idle_wal_bytes=bound)[0]["idle"] is True
    assert drains.submits() == (4 if held else 3)


def test_a_slot_near_its_max_slot_wal_keep_size_is_never_idle(drains: Drains) -> None:
    # With max_slot_wal_keep_size below the WAL an idle run may leave (safe_wal_size under
    # idle_wal_bytes), a skip leaves the slot to be invalidated ("lost": a new initial
    # snapshot) by a checkpoint after the next burst, where a drain would have advanced it.
    drains.src.sql("INSERT INTO other VALUES (1, 'o')")
    assert drains.run()[0]["idle"] is True and drains.submits() == 1
    drains.src.cluster.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    try:
        drains.src.cluster.execute("SELECT pg_reload_conf()")
        safe = drains.src.sql(
            "SELECT safe_wal_size FROM pg_replication_slots WHERE slot_name = %s",
            (drains.src.slot,),
        )[0][0]
        assert safe is not None and safe < 16 * 1024 * 1024
        result, _ = drains.run()
        assert result["idle"] is False and drains.submits() == 2, result
    finally:
        drains.src.cluster.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        drains.src.cluster.execute("SELECT pg_reload_conf()")


# -- a local master runs the application on the worker, without spark-submit ------------------


def test_a_local_master_drains_without_spark_submit(
    drains: Drains, capsys: pytest.CaptureFixture[str]
) -> None:
    """spark-submit's JVM (about ten seconds) is not started for a run that may not need Spark:
    the application runs as a Python process and merges small batches without a JVM."""
    drains.src.sql("UPDATE t SET v = 'changed' WHERE id = 1; INSERT INTO t VALUES (7, 'seven')")
    result, pushed = drains.run(spark_binary=None)
    assert drains.submits() == 1, "spark-submit was called"
    assert result["changes"] == 2 and result["idle"] is False and result["spark_start_s"] is None
    assert (
        pushed["confirmed_flush_lsn"] == drains.confirmed() == result["confirmed_flush_lsn_after"]
    )
    logged = capsys.readouterr().out
    assert "without spark-submit (master local[1])" in logged and "Spark-Submit cmd" not in logged
    assert "INFO window " in logged  # the application's progress lines reach the task log
    assert '{"slot"' not in logged  # its summary line is read, not logged
    rows = drains.src.sql("SELECT id, v FROM t ORDER BY id")
    from airflow_pglogrepl.tables import TableRef
    from tests.support.drain import lake_rows

    assert lake_rows(drains.lake_root, TableRef("public", "t")) == rows


def test_an_error_of_the_application_on_the_worker_is_raised_once(
    drains: Drains, capsys: pytest.CaptureFixture[str]
) -> None:
    import traceback

    from airflow_pglogrepl.exceptions import SparkApplicationError
    from airflow_pglogrepl.postgres.source import PgSource

    drains.src.sql("INSERT INTO t VALUES (100, 'x')")
    with (
        PgSource(drains.src.dsn).writer_lock(drains.src.slot, role="snapshot"),
        pytest.raises(SparkApplicationError) as failure,
    ):
        drains.run(spark_binary=None)
    assert failure.value.error == "LakeWriterBusyError" and failure.value.retryable
    told = "only one drain or snapshot may write it at a time"
    printed = "".join(traceback.format_exception(failure.value))
    assert printed.count(told) == 1 and told not in capsys.readouterr().out


def test_a_killed_task_ends_the_application_on_the_worker(drains: Drains, tmp_path: Path) -> None:
    """on_kill (a task cleared or timed out) ends the child process and what it started."""
    import os
    import threading

    from airflow_pglogrepl.faults import PAUSE_ENV
    from airflow_pglogrepl.testing.wait import wait_until

    drains.src.sql("INSERT INTO t VALUES (200, 'x')")
    paused = tmp_path / "paused"
    paused.mkdir()
    task = SlotDrainOperator(
        task_id="drain", postgres_conn_id=drains.conn_id, slot_name=drains.src.slot,
        publications=[drains.src.publication], lake=drains.lake_root, conn_id="drain_op_spark",
    )  # fmt: skip
    failed: list[BaseException] = []

    def execute() -> None:
        try:
            task.execute({"ti": FakeTI(), "outlet_events": defaultdict(SimpleNamespace)})  # type: ignore[arg-type]
        except BaseException as exc:  # what the killed run raised
            failed.append(exc)

    os.environ[PAUSE_ENV] = f"before_commit:{paused}"
    try:
        runner = threading.Thread(target=execute)
        runner.start()
        wait_until(lambda: any(paused.iterdir()), what="the application paused in its run")
        pid = task._worker_run.process.pid  # type: ignore[union-attr]
        task.on_kill()
        runner.join(timeout=60)
    finally:
        del os.environ[PAUSE_ENV]
    assert not runner.is_alive()
    assert failed and "exit status" in str(failed[0]), failed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_table_in_quarantine_fails_every_run_until_re_snapshotted_or_warns(
    drains: Drains, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run that quarantines a table fails naming it (no retry can help), and so does every
    later run, idle or not, until the table is re-snapshotted; ``on_quarantine="warn"`` ends
    the task well, its closing paragraph naming the table."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_pglogrepl.boundary import raised_error
    from airflow_pglogrepl.exceptions import SparkApplicationError

    drains.src.sql("ALTER TABLE t ADD COLUMN at timestamp")
    drains.src.sql("INSERT INTO t VALUES (50, 'bad', '294250-01-01')")
    for _ in range(2):  # the second run has nothing new to drain: not idle all the same
        with pytest.raises(AirflowFailException) as failure:  # no retry can help
            drains.run(spark_binary=None)
        error = raised_error(failure.value)
        assert isinstance(error, SparkApplicationError)
        assert error.error == "QuarantinedTablesError" and not error.retryable
        assert "public.t: UnstorableValueError" in str(error)
    assert drains.confirmed() == str(Lake(drains.lake_root, drains.src.slot).position())
    result, _ = drains.run(spark_binary=None, on_quarantine="warn")
    assert set(result["quarantined"]) == {"public.t"}
    assert "changes kept in" in capsys.readouterr().out


def test_a_following_run_is_submitted_though_idle_and_ends_at_its_bound(drains: Drains) -> None:
    """``follow`` with ``follow_seconds``: the idle check does not apply (the run waits for
    changes), a change made while it follows is drained, and it ends when its time is up."""
    import threading

    from airflow_pglogrepl.testing.wait import wait_until
    from tests.support.drain import lake_rows

    def write_while_following() -> None:
        active = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active"
        wait_until(lambda: drains.src.sql(active, (drains.src.slot,)) == [(1,)],
                   what="the run streaming the slot")  # fmt: skip
        drains.src.sql("INSERT INTO t VALUES (300, 'while following')")

    writer = threading.Thread(target=write_while_following)
    writer.start()
    try:
        # (its time counts from the application's start: 4 s were not enough for the change
        # to arrive when the start-up took most of them, on a machine loaded by other tests)
        result, pushed = drains.run(spark_binary=None, follow=True, window_seconds=0.2,
                                    follow_seconds=10)  # fmt: skip
    finally:
        writer.join(timeout=120)
    assert result["idle"] is False and result["reader"] == "stream"
    assert result["follow"]["stopped_by"] == "time" and result["changes"] == 1
    assert pushed["confirmed_flush_lsn"] == drains.confirmed()
    from airflow_pglogrepl.tables import TableRef

    assert (300, "while following") in lake_rows(drains.lake_root, TableRef("public", "t"))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"follow_seconds": 5}, "set follow=True"),
        ({"follow": True, "window_seconds": 0}, "window_seconds must be a positive"),
        ({"follow": True, "follow_seconds": "soon"}, "follow_seconds must be a positive"),
    ],
)
def test_follow_arguments_are_checked_naming_the_argument(kwargs: dict[str, object],
                                                          error: str) -> None:  # fmt: skip
    with pytest.raises(ValueError, match=error):
        task = SlotDrainOperator(task_id="drain", postgres_conn_id="pg", slot_name="s",
                                 publications=["p"], lake="/tmp/lake", **kwargs)  # type: ignore[arg-type]  # fmt: skip
        task._app_args()


@pytest.mark.unit
def test_a_following_runs_arguments_reach_the_application() -> None:
    from airflow_pglogrepl.spark.drain_app import parse_args

    task = SlotDrainOperator(task_id="drain", postgres_conn_id="pg", slot_name="s",
                             publications=["p"], lake="/tmp/lake", follow=True,
                             window_seconds="1.5", follow_seconds=60,
                             merge_seconds="12")  # type: ignore[arg-type]  # fmt: skip
    args = parse_args(task._app_args())
    assert args.follow and args.window_seconds == 1.5 and args.follow_for == 60.0
    assert args.merge_seconds == 12.0
    plain = parse_args(SlotDrainOperator(task_id="d", postgres_conn_id="pg", slot_name="s",
                                         publications=["p"], lake="/l")._app_args())  # fmt: skip
    assert not plain.follow and plain.follow_for is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("given", "repair", "tables", "repaired"),
    [
        ({"resync": ["public.a", 'public."b, c"']}, {}, ["public.a", 'public."b, c"'], False),
        ({"resync": "public.a, public.b"}, {}, ["public.a", "public.b"], False),
        ({"parity": ["public.a"]}, {"parity_repair": "True"}, ["public.a"], True),
        ({"parity": ""}, {"parity_repair": "False"}, [], False),
    ],
)
def test_resync_and_parity_tables_reach_the_application(
    given: dict[str, object], repair: dict[str, object], tables: list[str], repaired: bool
) -> None:
    """Given as a list, or as the text a trigger's param renders to: each table reaches
    drain_app, and a rendered "False" asks for no repair."""
    from airflow_pglogrepl.spark.drain_app import parse_args

    task = SlotDrainOperator(task_id="d", postgres_conn_id="pg", slot_name="s",
                             publications=["p"], lake="/l", **given, **repair)  # type: ignore[arg-type]  # fmt: skip
    args = parse_args(task._app_args())
    assert (args.resync or args.parity) == tables
    assert args.parity_repair is repaired and args.on_incomplete == "backfill"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("given", "sent"),
    [
        (True, ["*"]),
        (False, []),
        ("True", ["*"]),
        (["public.a", "public.b"], ["public.a", "public.b"]),
        ("public.a, public.b", ["public.a", "public.b"]),
    ],
)
def test_history_tables_reach_the_application(given: object, sent: list[str]) -> None:
    from airflow_pglogrepl.spark.drain_app import parse_args

    task = SlotDrainOperator(task_id="d", postgres_conn_id="pg", slot_name="s",
                             publications=["p"], lake="/l", history=given)  # type: ignore[arg-type]  # fmt: skip
    assert parse_args(task._app_args()).history == sent


@pytest.mark.parametrize(("given", "sent"), [(None, None), (0, 0), ("1048576", 1 << 20)])
def test_where_a_history_merges_on_spark_reaches_the_application(
    given: int | str | None, sent: int | None
) -> None:
    from airflow_pglogrepl.spark.drain_app import parse_args

    task = SlotDrainOperator(task_id="d", postgres_conn_id="pg", slot_name="s", publications=["p"],
                             lake="/l", history=True, history_spark_bytes=given)  # fmt: skip
    assert parse_args(task._app_args()).history_spark_bytes == sent
    assert "history_spark_bytes" in SlotDrainOperator.template_fields
