"""Cancel a table's Spark merge that has stopped making progress, so the run fails instead of
hanging.

Why: a Spark merge whose driver runs short of heap can wait without end: a job running, no task
of the application active, nothing finishing, both processes idle (seen with 40,000 rows of
16 KiB updated once: a local checkpoint of the merge's input waited over five minutes with 806
MiB of a 1 GiB heap in use). The run holds the lake's writer lock all that time, so every later
run fails "writer busy" until someone kills it. A failed run releases the lock and is retried.

How: each table's merge runs in a Spark job group of its own (set on the thread that merges, so
its jobs and only they belong to it). A watcher thread reads Spark's status tracker and task
scheduler and cancels the group once one of its jobs has been running for ``stall_seconds``
with no task of the whole application running (another table's merge holding the executors is
progress, not a stall), none of the group's own tasks finishing, and executors to run on (a
cluster application waiting for its first executor waits for resources, not on itself). A
group still stalled a bound after its cancel is cancelled again, with a warning each time.

A merge cancelled before it commits changes nothing: the state keeps its version and the next
run merges the same range again. The cancel's own error becomes ``MergeStalledError``
(retryable), naming the table and the fix; any other error passes as it is. A job stalled after
the commit (Delta's checkpoint runs in the same thread) is cancelled the same way, and
``materialize`` finds the state merged and says so instead of failing.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_pglogrepl.exceptions import MergeStalledError

log = logging.getLogger("airflow_pglogrepl.lake")

STALL_SECONDS = 600.0  # the default bound: far above any merge task's gap between progress
_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


class _Watcher:
    """The thread that watches one job group and cancels it once it stalls."""

    def __init__(self, context: Any, group: str, stall_seconds: float,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.context, self.group, self.stall = context, group, stall_seconds
        self.clock = clock
        self.cancelled = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"stall-watch-{group}", daemon=True)

    def _run(self) -> None:
        poll = min(5.0, max(0.05, self.stall / 10))
        progress_at, finished = self.clock(), -1
        while not self.stop.wait(poll):
            try:
                running, done, active = self._status()
            except Exception as exc:  # a status read that failed is no stall: look again
                log.debug("merge watch of %s: status not read (%s)", self.group, exc)
                continue
            now = self.clock()
            if (
                not running
                or active > 0
                or done != finished
                or _waiting_for_executors(self.context)
            ):
                progress_at, finished = now, done
                continue
            if now - progress_at >= self.stall:
                log.warning("merge job group %s: no progress for %.0f s; cancelling it%s",
                            self.group, now - progress_at,
                            " again" if self.cancelled else "")  # fmt: skip
                self.cancelled = True
                try:
                    self.context.cancelJobGroup(self.group)
                except Exception as exc:  # a driver short of heap may fail the call: again later
                    log.error("merge job group %s: the cancel failed (%s); trying again in "
                              "%.0f s", self.group, exc, self.stall)  # fmt: skip
                progress_at = now  # still stalled a bound later: cancelled again, and said

    def _status(self) -> tuple[bool, int, int]:
        """Whether a job of the group is running, the tasks its stages finished, and the tasks
        active in the whole application."""
        tracker = self.context.statusTracker()
        running, done = False, 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            running = running or str(job.status) == "RUNNING"
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                done += 0 if stage is None else int(stage.numCompletedTasks)
        active = _running_tasks(self.context)
        if active is None:  # no scheduler to ask: the status store's count (may lag ~10 s)
            active = 0
            for stage_id in tracker.getActiveStageIds():
                stage = tracker.getStageInfo(stage_id)
                active += 0 if stage is None else int(stage.numActiveTasks)
        return running, done, active


def _running_tasks(context: Any) -> int | None:
    """Tasks running in the whole application, from the task scheduler itself: the status
    store's count of a stage's active tasks is refreshed only by the next task event or
    executor heartbeat, so a stage of long tasks reads 0 active for its first ten seconds."""
    try:
        counts = context._jsc.sc().taskScheduler().runningTasksByExecutors().valuesIterator()
        total = 0
        while counts.hasNext():
            total += int(counts.next())
        return total
    except Exception:  # not a JVM SparkContext (or one without that scheduler)
        return None


def _waiting_for_executors(context: Any) -> bool:
    """Whether a cluster application has no executor yet (pods pending, a queue, dynamic
    allocation scaling up): its jobs wait for resources, which is no stall. A local master runs
    its tasks in the driver and never waits so."""
    try:
        if str(context.master).startswith("local"):
            return False
        return int(context._jsc.sc().getExecutorIds().size()) == 0
    except Exception:  # nothing to ask: judged by the tasks alone
        return False


@contextmanager
def watched(context: Any, table: str, stall_seconds: float | None, *,
            clock: Callable[[], float] = time.monotonic) -> Iterator[None]:  # fmt: skip
    """Run the block (one table's Spark merge, on this thread) in a job group of its own,
    cancelled once it stalls for ``stall_seconds`` (0 or None: not watched); the cancel's error
    is raised as ``MergeStalledError``."""
    if not stall_seconds or stall_seconds <= 0:
        yield
        return
    group = f"pglogrepl-merge-{uuid.uuid4().hex[:12]}"
    context.setJobGroup(group, f"merge of {table}", interruptOnCancel=True)
    watcher = _Watcher(context, group, float(stall_seconds), clock)
    watcher.thread.start()
    try:
        yield
    except Exception as exc:
        if watcher.cancelled and _is_cancel(exc, group):
            raise MergeStalledError(table, float(stall_seconds)) from None
        raise
    finally:
        watcher.stop.set()
        watcher.thread.join()
        for key in _GROUP_PROPERTIES:  # the pool's thread merges another table next
            context.setLocalProperty(key, None)


def _is_cancel(exc: BaseException, group: str) -> bool:
    """Whether ``exc`` is Spark's error for the cancel of ``group`` (its text names the group)."""
    seen: BaseException | None = exc
    while seen is not None:
        if group in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
