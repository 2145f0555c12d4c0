"""The task boundary: a non-retryable error of ours fails the task at once, with its message;
retryable and foreign errors reach Airflow unchanged; every operator and sensor has the boundary;
a Spark application's error crosses spark-submit with its class and retry decision (the
application's side: tests/spark/test_app.py; a sensor's own loop: tests/sensors/test_base.py)."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import traceback
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

import airflow_pglogrepl.operators
import airflow_pglogrepl.sensors
from airflow_pglogrepl import exceptions
from airflow_pglogrepl.boundary import BOUNDARY_METHODS, TaskBoundary, at_boundary, raised_error
from airflow_pglogrepl.operators.drain import SlotDrainOperator


def _raising(exc: BaseException) -> Any:
    @at_boundary
    def execute(context: object) -> None:
        raise exc

    return execute


def test_a_non_retryable_error_fails_the_task_at_once_with_its_message() -> None:
    lost = exceptions.SlotLostError("orders", "wal_removed")
    with pytest.raises(AirflowFailException) as failure:
        _raising(lost)({})
    assert str(failure.value) == f"SlotLostError: {lost}" and raised_error(failure.value) is lost
    # said once: the failure does not chain the error, whose message it repeats
    printed = "".join(traceback.format_exception(failure.value))
    assert printed.count(str(lost)) == 1, printed
    assert "_raising" in printed  # the error's own traceback is kept


def test_a_non_retryable_error_keeps_the_servers_words_as_the_cause() -> None:
    server = RuntimeError("ERROR: logical decoding requires wal_level >= logical")
    error = exceptions.SlotLostError("orders", "wal_removed")
    error.__cause__ = server
    with pytest.raises(AirflowFailException) as failure:
        _raising(error)({})
    assert failure.value.__cause__ is server


def test_the_failure_callbacks_recipe_in_the_docs_finds_our_error() -> None:
    """docs/reference/errors.md tells a failure callback how to find our error behind
    ``AirflowFailException``: the way it names must work."""
    import airflow_pglogrepl.boundary as boundary

    docs = (Path(__file__).parent.parent / "docs" / "reference" / "errors.md").read_text()
    recipe = docs[docs.index("**Failure callbacks**") :].split("\n\n")[0]
    assert 'raised_error(context["exception"])' in recipe and "__cause__`" in recipe
    assert "raised_error" in boundary.__all__
    lost = exceptions.SlotLostError("orders", "wal_removed")
    with pytest.raises(AirflowFailException) as failure:
        _raising(lost)({})
    assert isinstance(raised_error(failure.value), exceptions.SlotLostError)
    assert not isinstance(failure.value.__cause__, exceptions.SlotLostError)


def test_an_error_raised_while_another_was_handled_keeps_that_one_in_the_task_log() -> None:
    """A cleanup that fails while an error propagates: the first error is the context of the
    second, and the one that says what went wrong first."""
    first = RuntimeError("ERROR: could not read block 7 of relation 16384")

    @at_boundary
    def execute(context: object) -> None:
        try:
            raise first
        finally:  # a cleanup that fails in turn, as a finally block or an except clause can
            raise exceptions.SlotLostError("orders", "wal_removed")

    with pytest.raises(AirflowFailException) as failure:
        execute({})
    printed = "".join(traceback.format_exception(failure.value))
    assert "could not read block 7" in printed, printed
    assert printed.count(str(exceptions.SlotLostError("orders", "wal_removed"))) == 1, printed
    # an error raised "from None" on purpose stays without the one it replaced
    with pytest.raises(AirflowFailException) as failure:
        _raising_from_none(first)({})
    assert "could not read block 7" not in "".join(traceback.format_exception(failure.value))


def _raising_from_none(hidden: BaseException) -> Any:
    @at_boundary
    def execute(context: object) -> None:
        try:
            raise hidden
        except RuntimeError:
            raise exceptions.SlotLostError("orders", "wal_removed") from None

    return execute


@pytest.mark.parametrize(
    "error",
    [
        exceptions.SlotInUseError("orders", 4242),
        exceptions.ConnectionFailedError("connection refused"),
        exceptions.LakeWriterBusyError("orders", None),
        exceptions.SnapshotLockError("public.t", 60.0, ["pid 7"]),
        ValueError("not ours"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_retryable_and_foreign_errors_reach_airflow_unchanged(error: Exception) -> None:
    with pytest.raises(type(error)) as raised:
        _raising(error)({})
    assert raised.value is error


def test_every_error_says_whether_a_retry_can_help() -> None:
    retryable = {
        name
        for name, cls in vars(exceptions).items()
        if inspect.isclass(cls) and issubclass(cls, exceptions.PgLogReplError) and cls.retryable
    }
    # the conditions that pass by themselves; everything else waits for a person
    assert retryable == {
        "ConnectionFailedError",
        "SlotInUseError",
        "SnapshotNotCommittedError",
        "SnapshotReadError",
        "SnapshotLockError",
        "TableRewrittenError",
        "CatalogChangedError",
        # an exported snapshot kept waiting by a transaction left open: it ends by itself
        "SnapshotWaitError",
        "ArrowPeekError",
        "LakeWriterBusyError",
        "FenceLockBusyError",
        # a run that lost its lock, or whose commit another writer overtook: the next run
        # starts from what the lake holds
        "WriterLockLostError",
        "LakeCommitConflictError",
        # an object store that did not answer when the task looked at the lake's bucket
        "LakeStoreUnreachableError",
        # a replication stream ended by the server (a terminated walsender, a restart)
        "SlotStreamError",
        # a standby a failover slot's reads wait for, away: back by itself, or by its DBA
        "StandbyNotConfirmingError",
        # a Spark merge cancelled for making no progress, and a split whose bucket files were
        # removed under it: nothing was committed, the next run merges again
        "MergeStalledError",
        "BucketLostError",
    }


def _task_classes() -> list[type]:
    found: dict[str, type] = {}
    for package in (airflow_pglogrepl.operators, airflow_pglogrepl.sensors):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseOperator) and cls.__module__.startswith("airflow_pglogrepl"):
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


def test_every_operator_and_sensor_of_the_package_has_the_boundary() -> None:
    classes = _task_classes()
    assert len(classes) >= 20, [c.__name__ for c in classes]
    for cls in classes:
        assert issubclass(cls, TaskBoundary), f"{cls.__name__} lacks TaskBoundary"
        for name in BOUNDARY_METHODS:
            owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
            if owner is not None and issubclass(owner, TaskBoundary):
                method = owner.__dict__[name]
                assert getattr(method, "__pglogrepl_boundary__", False), (cls, name)


def test_the_boundary_is_outside_airflows_own_execute_wrapper() -> None:
    # Airflow wraps execute when the class is made (ExecutorSafeguard); ours must wrap that, not
    # be wrapped by it, or a class Airflow re-wraps would lose it.
    execute = SlotDrainOperator.__dict__["execute"]
    assert execute.__pglogrepl_boundary__
    safeguard = execute.__wrapped__
    assert "ExecutorSafeguard" in safeguard.__code__.co_qualname
    assert not hasattr(safeguard.__wrapped__, "__wrapped__")  # the operator's own execute


def _operator_whose_submit_prints(
    monkeypatch: pytest.MonkeyPatch, lines: list[str]
) -> SlotDrainOperator:
    def submit(self: SlotDrainOperator, context: object) -> None:
        self._hook = type("Hook", (), {"captured": lines})()
        raise AirflowException("Cannot execute: spark-submit ... Error code is: 1.")

    monkeypatch.setattr(SparkSubmitOperator, "execute", submit)
    return SlotDrainOperator(
        task_id="drain", postgres_conn_id="pg", slot_name="s", publications=["p"], lake="/lake"
    )


def test_the_applications_error_is_raised_again_on_the_operators_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused = {"error": "SlotAheadOfLakeError", "message": "slot 's' is ahead", "retryable": False}
    operator = _operator_whose_submit_prints(monkeypatch, ["log line", json.dumps(refused)])
    with pytest.raises(exceptions.SparkApplicationError) as raised:
        operator._run_application({})  # type: ignore[arg-type]
    assert raised.value.error == "SlotAheadOfLakeError" and not raised.value.retryable
    assert "slot 's' is ahead" in str(raised.value)
    with pytest.raises(AirflowFailException, match="SlotAheadOfLakeError"):
        at_boundary(lambda: operator._run_application({}))()  # type: ignore[arg-type]


def test_a_crash_without_a_report_stays_the_providers_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator = _operator_whose_submit_prints(monkeypatch, ["java.lang.OutOfMemoryError"])
    with pytest.raises(AirflowException, match="Error code is: 1"):
        operator._run_application({})  # type: ignore[arg-type]


# -- errors whose retry decision depends on their cause -----------------------------------------


def test_a_lock_or_an_unreachable_publisher_lets_a_subscription_statement_retry() -> None:
    import psycopg
    from psycopg import errors as pgerr

    from airflow_pglogrepl.postgres.errors import subscription_statement_errors as _redacted

    def failing(error: Exception) -> exceptions.SubscriptionStatementError:
        with pytest.raises(exceptions.SubscriptionStatementError) as raised, _redacted(["pw"]):
            raise error
        return raised.value

    assert failing(pgerr.LockNotAvailable("lock timeout")).retryable
    assert failing(psycopg.OperationalError("could not connect to the publisher")).retryable
    refused = failing(pgerr.InsufficientPrivilege("must be superuser; password pw"))
    assert not refused.retryable and "pw" not in str(refused)


def test_a_publisher_short_of_a_setting_is_named_with_its_fix_and_retry_decision() -> None:
    """The publisher's refusals as the subscriber relays them (issue 27); before: a
    SubscriptionStatementError with the server's text only."""
    import psycopg

    from airflow_pglogrepl.postgres.errors import subscription_statement_errors as _redacted

    publisher = {"host": "pub.example", "port": "5433", "user": "rep", "dbname": "shop"}

    def failing(text: str) -> exceptions.PublisherNotConfiguredError:
        with (
            pytest.raises(exceptions.PublisherNotConfiguredError) as raised,
            _redacted(["pw"], publisher),
        ):
            raise psycopg.OperationalError(text)
        assert text in str(raised.value.__cause__)
        return raised.value

    wal = failing(
        'could not create replication slot "shop_sub": ERROR:  logical decoding requires '
        "wal_level >= logical"
    )
    assert (wal.setting, wal.retryable) == ("wal_level", False)
    assert str(wal) == (
        "the publisher PostgreSQL rep@pub.example:5433/shop refused to create replication slot "
        "'shop_sub': wal_level must be logical there. Fix: set wal_level = logical on the "
        "publisher pub.example:5433 (ALTER SYSTEM SET wal_level = 'logical', or in its "
        "postgresql.conf) and restart it: wal_level only changes on restart, and until then "
        "every run fails alike. Nothing was created on the subscriber"
    )
    slots = failing(
        'could not create replication slot "shop_sub": ERROR:  all replication slots are in use'
        "\nHINT:  Free one or increase max_replication_slots."
    )
    assert (slots.setting, slots.retryable) == ("max_replication_slots", True)
    assert "raise max_replication_slots there and restart it" in str(slots)
    assert "pub.example:5433" in str(slots)
    busy = failing(
        'could not connect to the publisher: connection to server at "pub.example", port 5433 '
        "failed: FATAL:  number of requested standby connections exceeds max_wal_senders "
        "(currently 10)"
    )
    assert (busy.setting, busy.retryable) == ("max_wal_senders", True)
    assert "end unused replication connections on the publisher pub.example:5433" in str(busy)
    none = failing(  # as PostgreSQL 17 says it, the setting quoted
        "could not connect to the publisher: FATAL:  number of requested standby connections "
        'exceeds "max_wal_senders" (currently 0)'
    )
    assert (none.setting, none.retryable) == ("max_wal_senders", False)
    assert "raise max_wal_senders on the publisher pub.example:5433 (it is 0" in str(none)


def _relayed(text: str) -> Exception:
    """What ``_redacted`` raises for the subscriber's error ``text``."""
    import psycopg
    from psycopg import errors as pgerr

    from airflow_pglogrepl.postgres.errors import subscription_statement_errors as _redacted

    publisher = {"host": "pub.example", "port": "5433", "user": "rep", "dbname": "shop"}
    with pytest.raises(exceptions.PgLogReplError) as raised, _redacted(["pw"], publisher):
        raise pgerr.ProtocolViolation(text) if "replication slot" in text else psycopg.Error(text)
    return raised.value


def test_a_name_in_the_publishers_text_is_not_taken_for_its_setting() -> None:
    """The refusal is told by the server's sentence, not by words anywhere in the text: a slot
    (a subscription) named after them is not a publisher short of wal_level or of slots.
    Before: any failure to create such a slot (here: it exists) read as "set wal_level =
    logical and restart", not retryable."""
    for slot in ("logical_wal_level_sub", "all_replication_slots_are_in_use"):
        error = _relayed(
            f'could not create replication slot "{slot}": ERROR:  replication slot "{slot}" '
            f"already exists"
        )
        assert not isinstance(error, exceptions.PublisherNotConfiguredError), str(error)
        assert "already exists" in str(error)


def test_a_standby_publisher_is_told_to_fix_its_primary() -> None:
    """PostgreSQL 16+ decodes on a standby only when its primary has wal_level = logical: the
    fix is on the primary, not on the standby the subscription connects to (before: "set
    wal_level = logical on the publisher pub.example:5433")."""
    for said in (
        "logical decoding on standby requires wal_level >= logical on the primary",
        'logical decoding on standby requires "wal_level" >= "logical" on the primary',  # 17
    ):
        error = _relayed(f'could not create replication slot "shop_sub": ERROR:  {said}')
        assert isinstance(error, exceptions.PublisherNotConfiguredError)
        assert error.retryable is False
        assert "on the primary of the publisher pub.example:5433 (a standby)" in str(error)


def test_a_publisher_without_replication_slots_is_not_retried() -> None:
    """max_replication_slots = 0 on the publisher: no slot frees up, every retry fails alike.
    Before: a retryable SubscriptionStatementError without the fix."""
    error = _relayed(
        'could not create replication slot "shop_sub": ERROR:  replication slots can only be '
        "used if max_replication_slots > 0"
    )
    assert isinstance(error, exceptions.PublisherNotConfiguredError)
    assert (error.setting, error.retryable) == ("max_replication_slots", False)
    assert "raise max_replication_slots on the publisher pub.example:5433" in str(error)
