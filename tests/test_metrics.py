"""The provider's metric names and values (what docs/reference/metrics.md lists), as sent to
Airflow's ``Stats``; a StatsD server receives them in a real DAG run in
tests/e2e/test_pglogrepl_incremental_drain.py."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_pglogrepl import metrics

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float]] = []

    def __getattr__(self, kind: str) -> Any:
        return lambda name, value: self.sent.append((kind, name, value))


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float]]:
    recorder = Recorder()
    monkeypatch.setattr(metrics, "_stats", lambda: recorder)
    return recorder.sent


def test_a_drain_sends_counts_gauges_and_its_merge_time(sent: list[Any]) -> None:
    metrics.drain("lake_orders", {"windows": 3, "transactions": 15, "changes": 3000,
                                  "changes_per_s": 1500.5, "lag_bytes_left": 0, "idle": False,
                                  "materialize_s": 0.42, "materialized": {"public.t": "0/1"},
                                  "quarantined": {"public.t3": {}}})  # fmt: skip
    assert ("incr", "pglogrepl.lake_orders.drain.changes", 3000) in sent
    assert ("gauge", "pglogrepl.lake_orders.drain.lag_bytes_left", 0.0) in sent
    assert ("gauge", "pglogrepl.lake_orders.drain.quarantined_tables", 1.0) in sent
    assert ("timing", "pglogrepl.lake_orders.drain.materialize", 420.0) in sent  # ms


def test_names_hold_only_what_a_metric_name_may(sent: list[Any]) -> None:
    metrics.subscription('sub "x" é', tables_not_ready=2, apply_errors=None)
    assert sent == [("gauge", "pglogrepl.subscription.sub__x___.tables_not_ready", 2.0)]


def test_a_backend_that_refuses_a_metric_never_fails_the_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Broken:
        def incr(self, name: str, value: float) -> None:
            raise ValueError("refused")

    monkeypatch.setattr(metrics, "_stats", Broken)
    metrics.snapshot("s", {"rows": 5, "tables": {}})  # no error
