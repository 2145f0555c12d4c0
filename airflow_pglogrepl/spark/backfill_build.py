"""A backfill's steps, off the drain's path: its chunks copied, then its state built (or its
parity checked), on a thread of its own while the run's windows go on.

The build reads every chunk and the changes since ``low`` and writes the table's state whole,
so it grows with the table: about 10 s a million rows on the benchmark's machine
(bench/bench_backfill.py). Run between two windows, as it was, it held the drain that long: a
table of 100 million rows would have stopped the lake for a quarter of an hour. A chunk's copy
(seconds for a million rows) held it as long after each window, so it runs here too.

What the thread writes, no window writes: the backfill's rows (a chunk at a time), the build's
own staging table, then
``state/<table>``, which the drain leaves alone while its table is backfilled (the run's merge
comes after the thread has ended). The backfill's records (its plans, the lake's coverage) stay
the drain thread's: it takes the outcome after a window, or waits for it when the run ends
(``Builder.outcome``), so no record is ever written by two threads at once, and no run ends,
lock released, while the thread still writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Any

from airflow_pglogrepl.lake import backfill as record
from airflow_pglogrepl.lake import staging
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

__all__ = ["Builder", "Building", "Found", "cause_of", "changelog_version", "step_of"]

log = logging.getLogger("airflow_pglogrepl.backfill")

# What a step found: None for a build, what the comparison found for a parity check.
Found = dict[str, Any] | None


@dataclass(frozen=True)
class Building:
    """One step under way: the backfill's plan and the lake position it builds at."""

    plan: record.Plan
    position: LSN
    future: Future[Found]
    kind: str = "build"  # or "chunk": a chunk's copy (``spark.backfill``)


class Builder:
    """One step at a time, on one thread."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self.building: Building | None = None

    def start(self, plan: record.Plan, position: LSN, step: Callable[[], Found], *,
              kind: str = "build") -> None:  # fmt: skip
        assert self.building is None, "one step at a time"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="backfill")
        self.building = Building(plan, position, self._pool.submit(step), kind)
        if kind == "build":
            log.info("%s: its state is being built at %s while the drain goes on", plan.table,
                     position)  # fmt: skip
        else:
            log.info("%s: a chunk is being copied while the drain goes on", plan.table)

    def busy(self, table: str | None = None) -> bool:
        """Whether a step is under way (for ``table``, when given)."""
        return self.building is not None and table in (None, self.building.plan.table)

    def outcome(self, timeout_s: float | None = 0.0) -> tuple[Building, Exception | None,
                                                              Found] | None:  # fmt: skip
        """The step that ended (waiting up to ``timeout_s``; None: for as long as it takes),
        with its error or what it found; None while it goes on, or when none was started."""
        building = self.building
        if building is None:
            return None
        wait([building.future], timeout=timeout_s)
        if not building.future.done():
            return None
        self.building = None
        error = building.future.exception()  # (a TimeoutError of the step's own, too)
        if error is not None:
            assert isinstance(error, Exception)
            return building, error, None
        return building, None, building.future.result()

    def close(self) -> None:
        """End the thread (after ``outcome(None)``: nothing is under way)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def cause_of(exc: Exception) -> str:
    """What an error says, without a JVM's stack: its first line and, from a Spark job, the
    innermost cause (where the product's own message is)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return ""
    causes = [line for line in lines if line.startswith("Caused by:")]
    said = lines[0] if not causes else f"{lines[0]} ... {causes[-1]}"
    return said if len(said) <= 600 else said[:597] + "..."


def step_of(spark: Any, lake: Lake, plan: record.Plan, position: LSN, *,
            repair: bool) -> Callable[[], Found]:  # fmt: skip
    """The step that ends ``plan`` at ``position`` (its build, or its parity check, which
    replaces a state found different when ``repair``), made on the drain's thread."""
    version = changelog_version(lake, plan.table)
    if plan.why == "parity":
        return partial(parity_step, spark, lake, plan, position, version, repair=repair)
    return partial(build_step, spark, lake, plan, position, version)


def changelog_version(lake: Lake, table: str) -> int | None:
    """The Delta version of ``table``'s changelog, read on the drain's thread between two
    windows: the one its build reads, holding every window up to the lake's position and none
    after (windows committed while the build runs may rename a column the chunks' rows know by
    its former name). None: the table has no changelog."""
    from airflow_pglogrepl.lake import delta
    from airflow_pglogrepl.lake.layout import table_dir

    opened = delta.open_table(lake.paths.changes(table_dir(TableRef.parse(table))))
    return None if opened is None else int(opened.version())


def build_step(spark: Any, lake: Lake, plan: record.Plan, position: LSN,
               version: int | None) -> Found:  # fmt: skip
    """The backfill's state built at ``position`` and put in place (``version``: the table's
    changelog version at ``position``, read on the drain's thread, ``changelog_version``)."""
    from airflow_pglogrepl.spark.backfill_state import build_state

    build_state(spark, lake, plan, position, version=version)
    return None


def parity_step(spark: Any, lake: Lake, plan: record.Plan, position: LSN,
                version: int | None, *, repair: bool) -> Found:  # fmt: skip
    """The parity check: the build (the source at ``position``) against the state, merged up
    to ``position`` first; the state replaced by the build when ``repair`` and different."""
    from airflow_pglogrepl.lake.layout import table_dir
    from airflow_pglogrepl.merge.materialize import materialize_table
    from airflow_pglogrepl.spark.backfill_state import build, key_fields, put_in_place
    from airflow_pglogrepl.spark.state_parity import compare

    name = table_dir(TableRef.parse(plan.table))
    built = build(spark, lake, plan, position, version=version)
    read = spark.read.format("delta").load(record.rows_uri(lake, plan)).columns
    keys = [f.name for f in key_fields(spark.read.format("delta").load(built).schema)]
    found: dict[str, Any]
    try:
        materialize_table(spark, lake, name, position, version=version)
    except Exception as exc:  # a state so damaged that its changes cannot be merged
        found = {"equal": False, "merge_error": cause_of(exc)}
    else:  # (the source's columns now: a dropped one the lake keeps is not compared)
        found = compare(spark, built, lake.paths.state(name), keys, columns=read)
    found["position"] = str(position)
    if not found["equal"] and repair:
        put_in_place(spark, lake, plan, built, position)
        found["repaired"] = True
    else:
        staging.remove(built)
    return found
