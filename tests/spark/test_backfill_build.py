"""The build's thread as the drain's thread sees it: a step under way is no outcome yet, a step
that ended is taken once, with what it found or the error it raised (a ``TimeoutError`` of its
own too: taken for a step still under way, it left the table in progress with no error, and
the run's repair rounds looping without a pause)."""

from __future__ import annotations

import threading

import pytest

from airflow_pglogrepl.lake.backfill import Plan
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.backfill_build import Builder

pytestmark = pytest.mark.unit

PLAN = Plan(table="public.b", relid=1, why="added", low="0/10", in_progress=(), files=(1,),
            columns=("id",), step=0, began="2026-12-03T00:00:00+00:00")  # fmt: skip


def test_a_step_under_way_then_its_outcome_once() -> None:
    builder = Builder()
    go = threading.Event()
    builder.start(PLAN, LSN(0x20), lambda: {"equal": go.wait(10)})
    assert builder.busy() and builder.busy("public.b") and not builder.busy("public.a")
    assert builder.outcome(0.01) is None  # still going
    go.set()
    ended = builder.outcome(None)
    assert ended is not None
    building, error, found = ended
    assert (building.plan, building.position, error, found) == (PLAN, LSN(0x20), None,
                                                                 {"equal": True})  # fmt: skip
    assert not builder.busy() and builder.outcome(None) is None  # taken once
    builder.close()


@pytest.mark.parametrize("raised", [RuntimeError("an executor was lost"), TimeoutError("read")])
def test_a_step_that_raised_is_an_outcome_with_its_error(raised: Exception) -> None:
    builder = Builder()

    def step() -> None:
        raise raised

    builder.start(PLAN, LSN(0x20), step)
    ended = builder.outcome(10)
    assert ended is not None and ended[1] is raised and ended[2] is None
    assert not builder.busy()
    builder.close()
