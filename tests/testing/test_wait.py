"""Polling a condition: its value when it holds, a clear timeout when it does not, and waits that
grow from short to at most a second."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.testing import wait
from airflow_pglogrepl.testing.wait import WaitTimeoutError, wait_until


def test_the_conditions_value_once_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(wait.time, "sleep", slept.append)
    answers = iter([None, 0, [], "ready"])
    assert wait_until(lambda: next(answers), what="a reply") == "ready"
    assert len(slept) == 3 and slept == sorted(slept) and slept[0] == 0.05


def test_a_timeout_names_what_was_awaited_and_what_was_last_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter(range(1000))
    monkeypatch.setattr(wait.time, "monotonic", lambda: float(next(clock)))
    slept: list[float] = []
    monkeypatch.setattr(wait.time, "sleep", slept.append)
    with pytest.raises(WaitTimeoutError, match=r"after 30s waiting for the slot; last: \[\]"):
        wait_until(list, what="the slot", timeout=30)
    assert max(slept) == 1.0  # growing waits, capped at a second
    assert isinstance(WaitTimeoutError("x"), AssertionError)  # a failed test, not an error
