"""The watchdog of Spark merges (``merge.stall_watch``): a merge whose job runs with no task
active anywhere and none of its own finishing is cancelled and fails as ``MergeStalledError``;
a merge waiting behind another table's tasks, an unrelated error and a real job with slow tasks
are left alone; the thread's job group is cleared afterwards. The stand-in context below plays
Spark's status tracker; the last test runs a real Spark job."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import MergeStalledError
from airflow_pglogrepl.merge.stall_watch import watched


@dataclass
class _Job:
    status: str
    stageIds: list[int]  # noqa: N815 (Spark's own name)


@dataclass
class _Stage:
    numActiveTasks: int  # noqa: N815
    numCompletedTasks: int  # noqa: N815


@dataclass
class _Context:
    """A SparkContext's job-group calls and status tracker, as the watchdog uses them: one job
    of the group, running, with stage 1; ``active`` tasks in stage 2 (another table's)."""

    active: int = 0
    completed: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    properties: dict[str, Any] = field(default_factory=dict)
    group: str | None = None

    def setJobGroup(self, group: str, description: str, interruptOnCancel: bool) -> None:  # noqa: N802,N803
        self.group = group
        self.properties["spark.jobGroup.id"] = group

    def setLocalProperty(self, key: str, value: Any) -> None:  # noqa: N802
        self.properties[key] = value

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802
        assert group == self.group
        self.cancelled.set()

    def statusTracker(self) -> _Context:  # noqa: N802
        return self

    def getJobIdsForGroup(self, group: str) -> list[int]:  # noqa: N802
        return [7] if group == self.group else []

    def getJobInfo(self, job_id: int) -> _Job:  # noqa: N802
        return _Job("RUNNING", [1])

    def getActiveStageIds(self) -> list[int]:  # noqa: N802
        return [1, 2]

    def getStageInfo(self, stage_id: int) -> _Stage:  # noqa: N802
        if stage_id == 1:
            return _Stage(0, self.completed)
        return _Stage(self.active, 0)


def _merge_until_cancelled(context: _Context, seconds: float) -> None:
    """A merge's body: waits for the cancel, then fails as Spark does when its group is."""
    if context.cancelled.wait(seconds):
        raise RuntimeError(f"Job 7 cancelled part of cancelled job group {context.group}")


@pytest.fixture
def context() -> Iterator[_Context]:
    yield _Context()


def test_a_merge_with_no_task_active_or_finishing_is_cancelled_and_named(
    context: _Context,
) -> None:
    with pytest.raises(MergeStalledError) as raised, watched(context, "public.t", 0.3):
        _merge_until_cancelled(context, 30)
    assert context.cancelled.is_set()
    assert "public.t" in str(raised.value) and "driver_memory" in str(raised.value)
    assert raised.value.retryable
    # the pool's thread merges another table next: the group is not left on it
    assert context.properties["spark.jobGroup.id"] is None


def test_a_cancel_that_fails_is_tried_again_a_bound_later(context: _Context) -> None:
    """A driver short of heap may fail the cancel call itself: the watch goes on and cancels
    again, instead of dying and leaving the merge hanging with the lock."""
    calls: list[str] = []
    cancel = context.cancelJobGroup

    def flaky(group: str) -> None:
        calls.append(group)
        if len(calls) == 1:
            raise RuntimeError("java.lang.OutOfMemoryError: Java heap space")
        cancel(group)

    context.cancelJobGroup = flaky  # type: ignore[method-assign]
    with pytest.raises(MergeStalledError), watched(context, "public.t", 0.2):
        _merge_until_cancelled(context, 30)
    assert len(calls) == 2


def test_a_merge_waiting_behind_another_tables_tasks_is_not_cancelled(
    context: _Context,
) -> None:
    context.active = 2  # the executors are busy with a sibling table's merge
    with watched(context, "public.t", 0.3):
        _merge_until_cancelled(context, 1.5)
    assert not context.cancelled.is_set()


def test_a_merge_whose_tasks_finish_is_not_cancelled(context: _Context) -> None:
    stop = threading.Event()

    def progress() -> None:
        while not stop.wait(0.05):
            context.completed += 1

    ticker = threading.Thread(target=progress)
    ticker.start()
    try:
        with watched(context, "public.t", 0.3):
            _merge_until_cancelled(context, 1.5)
    finally:
        stop.set()
        ticker.join()
    assert not context.cancelled.is_set()


def test_an_error_of_the_merge_itself_is_not_relabelled(context: _Context) -> None:
    with pytest.raises(ValueError, match="a schema"), watched(context, "public.t", 30):
        raise ValueError("a schema the merge refuses")
    assert not context.cancelled.is_set()


def test_no_bound_sets_no_group(context: _Context) -> None:
    for off in (0, None):
        with watched(context, "public.t", off):
            pass
    assert context.group is None


def test_a_real_job_whose_tasks_outlast_the_bound_is_not_cancelled(spark: Any) -> None:
    import time

    def slow(rows: Iterator[Any]) -> Iterator[int]:
        time.sleep(2.5)  # one task longer than the bound: active, so progress
        yield sum(1 for _ in rows)

    context = spark.sparkContext
    with watched(context, "public.slow", 1.0):
        counted = context.parallelize(range(10), 2).mapPartitions(slow).sum()
    assert counted == 10
    assert context.getLocalProperty("spark.jobGroup.id") is None
