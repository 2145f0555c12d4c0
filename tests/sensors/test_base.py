"""``VerdictSensor``, the replication sensors' base: a poke logs its verdict and pushes what it
saw (``observed``), succeeds with it, and fails a broken replication at once (no waiting for
the timeout; ``soft_fail`` skips it as Airflow's own loop would); an error in poke goes through
the sensor's loop, then the task boundary; deferred, it hands its trigger over with its timeout
and resumes with what the trigger saw, a broken check retrying as it would in poke mode."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred

from airflow_pglogrepl import exceptions
from airflow_pglogrepl.boundary import raised_error
from airflow_pglogrepl.models.verdicts import Verdict
from airflow_pglogrepl.sensors._base import VerdictSensor
from tests.support.airflow import FakeTI, context


class _Gate(VerdictSensor):
    """A sensor whose verdicts (or errors) are given: ``script`` is consumed poke by poke."""

    def __init__(self, *, script: list[Any], **kwargs: Any) -> None:
        super().__init__(deferrable=False, poke_interval=0, timeout=60, **kwargs)
        self.script = script

    def verdict(self) -> Verdict:
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def _gate(*script: Any, **kwargs: Any) -> _Gate:
    return _Gate(task_id="gate", script=list(script), **kwargs)


FAILED = Verdict(False, "subscription 'sub' is disabled. Fix: ENABLE it", failed=True)


DONE = Verdict(True, "every table ready", data={"ready": 1})


def test_a_failed_gate_fails_the_sensor_at_once_and_soft_fail_skips_it() -> None:
    with pytest.raises(AirflowFailException, match="is disabled") as failure:
        _gate(FAILED).execute(context())
    assert isinstance(raised_error(failure.value), exceptions.GateFailedError)
    with pytest.raises(AirflowSkipException):
        _gate(FAILED, soft_fail=True).execute(context())


def test_an_error_in_poke_goes_through_the_sensors_loop_then_the_boundary() -> None:
    missing = exceptions.SlotNotFoundError("lake_orders")
    with pytest.raises(AirflowFailException, match="does not exist") as failure:
        _gate(missing, soft_fail=True).execute(context())  # a typo is no skip
    assert raised_error(failure.value) is missing
    # silent_fail: the sensor logs it and pokes on, as Airflow documents
    assert _gate(missing, DONE, silent_fail=True).execute(context()) == {"ready": 1}


def test_a_deferred_gates_broken_check_retries_as_it_would_in_poke_mode() -> None:
    gate = _gate()
    broken = {"status": "error", "message": "ConnectionFailedError: refused", "retryable": True}
    with pytest.raises(exceptions.GateFailedError, match="refused"):
        gate.execute_complete(context(), broken)
    with pytest.raises(AirflowFailException, match="is disabled"):
        gate.execute_complete(context(), {"status": "failed", "message": FAILED.message})


def test_a_poke_pushes_what_it_saw_and_succeeds_with_it() -> None:
    ti = FakeTI()
    waiting = Verdict(False, "2 tables not ready", data={"ready": 0})
    assert _gate(waiting).poke(context(ti)) is False
    assert ti.pushed == {"observed": {"ready": 0}}
    done = _gate(DONE).poke(context(ti))
    assert isinstance(done, PokeReturnValue) and done.is_done and done.xcom_value == {"ready": 1}
    assert ti.pushed == {"observed": {"ready": 1}}


def test_a_deferred_sensor_hands_over_its_trigger_and_timeout() -> None:
    trigger = object()

    class Deferred(_Gate):
        def trigger(self) -> Any:
            return trigger

    sensor = Deferred(task_id="gate", script=[])
    sensor.deferrable, sensor.timeout = True, 90
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context())
    assert deferred.value.trigger is trigger and sensor.script == []  # no poke on the worker
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout is not None and deferred.value.timeout.total_seconds() == 90


def test_a_deferred_sensor_resumes_with_what_the_trigger_saw() -> None:
    ti = FakeTI()
    seen = {"lag_bytes": 0}
    event = {"status": "success", "message": "caught up", "data": seen}
    assert _gate().execute_complete(context(ti), event) == seen
    assert ti.pushed == {"observed": seen}
