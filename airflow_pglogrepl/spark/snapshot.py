"""Copy published tables into the lake's ``state/`` on Spark, inside a slot's exported snapshot.

The copy is the lake's starting point: the rows the tables held at the slot's consistent point,
typed exactly as the drain types them, committed in the lake at that point, so the drain
continues at the slot's first change with no gap and no overlap.

How the work is cut and copied on executors: ``spark.range_copy``.

How it becomes visible: an initial snapshot's tables must not appear one by one while others
are still being copied (a reader would take them for the lake's state although no snapshot
was committed, and a killed run could never take them back). So Spark writes each table's copy
staged, as a Delta table in ``state/<table>/snapshot-<consistent point>/``, where no reader of
``state/<table>`` looks (``lake.staging``). Only when every table is copied, and the guard has
checked nothing changed under the copy, is each staged copy published as version 0 of
``state/<table>`` (Spark's own commit, with the app transaction at the consistent point), and
then the lake records the snapshot (``Lake.record(kind="snapshot")``): that is the commit
point, and the lake's position from then on. A run killed while copying leaves staged
directories only; one killed while publishing (a few metadata writes per table) may leave
published tables without a committed snapshot. Either way the lake has no position, the next
initial snapshot removes what is left before it copies, and ``resolve`` reports it.

Re-snapshotting some tables (``tables=``; a table added to the publication later) uses a
temporary slot's snapshot instead and overwrites only those tables' state, each as one Delta
overwrite at that snapshot's consistent point (a reader sees the table before or after it,
never half of it, and each table stands on its own): the changelog the drain keeps writing
supplies everything after it (the merge takes changes from the state's version on).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import changelog_schema
from airflow_pglogrepl.exceptions import (
    LakeError,
    LakeMismatchError,
    LakeNotEmptyError,
    LakeNotSnapshottedError,
)
from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake import column_names, mapping, staging
from airflow_pglogrepl.lake.backfill import forget as forget_backfill
from airflow_pglogrepl.lake.evolve import numbered
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.quarantine import release
from airflow_pglogrepl.lake.snapshots import (
    BootstrapPlan,
    bootstrap_plan,
    check_empty_lake,
    existing_snapshot,
    remove_leftovers,
    resolve,
    snapshot_committed,
    temporary_slot_name,
)
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.range_copy import CHUNK_BYTES, CopyTask, plain_schema, table_info
from airflow_pglogrepl.spark.snapshot_arrow import (
    CopyStoppedError,
    Readers,
    copy_in_process,
    usable_cpus,
)
from airflow_pglogrepl.spark.snapshot_coverage import record_coverage
from airflow_pglogrepl.spark.snapshot_engine import SPARK_ABOVE_BYTES, check_engine, on_spark
from airflow_pglogrepl.spark.snapshot_spark import copy_on_spark
from airflow_pglogrepl.spark.snapshot_target import CopyTarget, lake_schema
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.postgres.snapshot import SnapshotTable
    from airflow_pglogrepl.postgres.snapshot_guard import SnapshotGuard

log = logging.getLogger("airflow_pglogrepl.snapshot")

DEFAULT_ROWS_PER_TASK = 1_000_000
DEFAULT_LOCK_TIMEOUT_S = 60.0  # for the copied tables' locks (see postgres.snapshot_guard)
# What the lake records of its snapshots moved to lake/snapshots.py: importable here as before.
__all__ = [
    "BootstrapPlan",
    "LakeNotEmptyError",
    "SnapshotCopy",
    "SnapshotPoint",
    "bootstrap_plan",
    "check_empty_lake",
    "existing_snapshot",
    "remove_leftovers",
    "resolve",
    "snapshot_committed",
    "temporary_slot_name",
]


# -- the driver ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotPoint:
    """An exported snapshot and the slot position it belongs to."""

    slot: str
    consistent_point: LSN
    snapshot_name: str


@dataclass
class TableCopy:
    """One table's part of a snapshot."""

    table: str
    rows: int = 0
    copy_bytes: int = 0  # Arrow bytes the tasks fetched (as ADBC typed them), not wire bytes
    tasks: int = 0
    blocks: int = 0
    seconds: float = 0.0
    engine: str = "spark"  # what copied it: "spark", or "process" (``spark.snapshot_arrow``)
    # {source name: lake name}: columns stored under another name (``lake.column_names``)
    stored_as: dict[str, str] = field(default_factory=dict)


@dataclass
class SnapshotResult:
    """What a snapshot did; ``to_dict`` is the JSON line the application prints last."""

    slot: str
    consistent_point: LSN
    snapshot_name: str
    mode: str  # "initial" or "tables"
    tables: list[TableCopy] = field(default_factory=list)
    plan_s: float = 0.0
    copy_s: float = 0.0
    commit_s: float = 0.0
    committed: bool = False
    # statements the snapshot's lock watcher canceled (``snapshot_guard.CanceledStatement``)
    ddl_canceled: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        rows = sum(t.rows for t in self.tables)
        copied = sum(t.copy_bytes for t in self.tables)
        return {
            "status": "committed" if self.committed else "failed",
            "committed": self.committed,
            "mode": self.mode,
            "slot": self.slot,
            "consistent_point": str(self.consistent_point),
            "snapshot_name": self.snapshot_name,
            "rows": rows,
            "copy_bytes": copied,
            "plan_s": round(self.plan_s, 3),
            "copy_s": round(self.copy_s, 3),
            "commit_s": round(self.commit_s, 3),
            "rows_per_s": round(rows / self.copy_s, 1) if self.copy_s > 0 else 0.0,
            "mb_per_s": round(copied / 1e6 / self.copy_s, 2) if self.copy_s > 0 else 0.0,
            "tables": {
                t.table: {
                    "rows": t.rows,
                    "tasks": t.tasks,
                    "blocks": t.blocks,
                    "copy_bytes": t.copy_bytes,
                    "seconds": round(t.seconds, 3),
                    "engine": t.engine,
                }
                for t in self.tables
            },
            "columns_stored_as": {t.table: t.stored_as for t in self.tables if t.stored_as},
            "ddl_canceled": list(self.ddl_canceled),
        }


class SnapshotCopy:
    """Copy the published tables at ``point`` into ``lake`` and commit them there.

    ``reader_params`` are the source's libpq parameters (the tasks connect with them). With
    ``tables`` only those tables are re-snapshotted into an existing lake; otherwise the lake
    must be empty and the whole publication is copied and committed at the consistent point.
    The snapshot must stay exported (its session open) until ``run`` returns.

    While it copies, the tables are locked (``snapshot_guard``): no rewrite can land in the
    middle, and one that landed before the locks is refused. ``lock_timeout_s`` bounds the wait
    for those locks, and a reader's wait behind a statement the watcher could not cancel.

    ``spark`` gives the Spark session, asked for only when a table is copied on Spark. With
    ``engine="auto"`` a table of up to ``spark_above_bytes`` of heap is copied in this process
    (``spark.snapshot_arrow``) and a bigger one on Spark; ``"process"`` and ``"spark"`` copy every
    table the one way (``spark.snapshot_engine``). A re-snapshot is copied on Spark.
    """

    def __init__(
        self,
        *,
        spark: Callable[[], Any] | None,
        lake: Lake,
        reader_params: dict[str, str],
        point: SnapshotPoint,
        publications: Sequence[str],
        tables: Sequence[TableRef] | None = None,
        tasks_per_table: int | None = None,
        rows_per_task: int = DEFAULT_ROWS_PER_TASK,
        parallelism: int = 4,
        chunk_bytes: int = CHUNK_BYTES,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        engine: str = "auto",
        spark_above_bytes: int = SPARK_ABOVE_BYTES,
    ) -> None:
        if not publications:
            raise ValueError("at least one publication is needed")
        self.spark = spark
        self.engine = check_engine(engine)
        self.spark_above_bytes = spark_above_bytes
        self.lake = lake
        self.reader_params = dict(reader_params)
        self.point = point
        self.publications = list(publications)
        self.tables = list(tables) if tables is not None else None
        self.tasks_per_table = tasks_per_table
        self.rows_per_task = rows_per_task
        self.parallelism = max(1, parallelism)
        self.chunk_bytes = chunk_bytes
        self.lock_timeout_s = lock_timeout_s
        self._task_params: dict[str, str] | None = None
        # ranges read at once in this process, over every table (a session and ~3 batches each)
        self._readers = Readers(usable_cpus())

    def run(self) -> SnapshotResult:
        """Copy, then commit; on failure remove what was staged and re-raise."""
        result = SnapshotResult(
            slot=self.point.slot,
            consistent_point=self.point.consistent_point,
            snapshot_name=self.point.snapshot_name,
            mode="initial" if self.tables is None else "tables",
        )
        self.lake.check_owner()  # before anything is cleaned up or judged by its contents
        if self.tables is None:
            check_empty_lake(self.lake)
            self.lake.check_writer()
            remove_leftovers(self.lake)
        elif self.lake.position() is None and not self.lake.begun_by_a_drain():
            raise LakeNotSnapshottedError(
                f"lake {self.lake.root} holds no commit yet: take an initial snapshot of the "
                f"whole publication first (tables=None)"
            )
        from airflow_pglogrepl.postgres.passfile import travelling_params
        from airflow_pglogrepl.postgres.snapshot_guard import SnapshotGuard

        with ExitStack() as stack:
            guard = stack.enter_context(SnapshotGuard(self.reader_params, result.snapshot_name))
            tables = self._plan(guard, result)
            # Once the tables are locked and checked (a refused snapshot writes nothing), before
            # the first copy: a drain of a lake whose snapshot then dies is refused.
            self.lake.claim(
                guard.source_identity(),
                publications=self.publications,
                began_with="snapshot" if self.tables is None else "drain",
            )
            self._task_params = stack.enter_context(travelling_params(self.reader_params))
            canceled = stack.enter_context(guard.watch())
            try:
                self._copy_and_commit(tables, result, guard)
            finally:
                result.ddl_canceled = [c.to_dict() for c in canceled]
                self._task_params = None  # its passfile is gone with the block
        fault("after_commit")
        return result

    def _plan(self, guard: SnapshotGuard, result: SnapshotResult) -> list[SnapshotTable]:
        """The tables to copy, read and locked in the snapshot; refused before any copy when
        the lake could not hold them."""
        began = time.monotonic()
        tables = guard.locked_tables(self.publications, self.tables, timeout_s=self.lock_timeout_s)
        for table in tables:  # before anything is copied: the drain would refuse them too
            if not table.columns:
                raise LakeError(
                    f"table {table.table} publishes no columns, and a lake table needs one at "
                    f"least (Parquet stores no rows without columns). Nothing was copied. Fix: "
                    f"publish a column of it, or drop it from {self.publications}"
                )
        result.plan_s = time.monotonic() - began
        return tables

    def _copy_and_commit(
        self, tables: list[SnapshotTable], result: SnapshotResult, guard: SnapshotGuard
    ) -> None:
        began = time.monotonic()
        if self.tables is not None:
            self._check_not_overtaken(tables)
            for table in tables:  # before its state changes: the chunks would predate it
                forget_backfill(self.lake, str(table.table))
        try:
            result.tables = self._copy_all(tables)
            result.copy_s = time.monotonic() - began
            fault("after_copy")
            began = time.monotonic()
            if self.tables is None:
                guard.verify()  # a partition attached during the copy: not the table at the point
                self._publish(tables)
                self._commit_initial(result)
        except BaseException:
            if self.tables is None:
                self._discard(tables)
            raise
        result.commit_s = time.monotonic() - began
        result.committed = True
        # after the commit point: a failure here leaves the next drain to judge the tables
        copied = [c.table for c in result.tables]
        record_coverage(self.lake, guard, self.publications, self.point.consistent_point,
                        copied, initial=self.tables is None)  # fmt: skip

    # -- steps --------------------------------------------------------------------------------

    def _copy_all(self, tables: Sequence[SnapshotTable]) -> list[TableCopy]:
        if not tables:
            return []
        workers = min(len(tables), self.parallelism)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="snapshot") as pool:
            futures = [pool.submit(self._copy_or_stop, t) for t in tables]
            wait(futures)
        failures = [f.exception() for f in futures if f.exception() is not None]
        # the failure that stopped the others, not one of theirs
        for failure in sorted(failures, key=lambda e: isinstance(e, CopyStoppedError)):
            raise failure  # type: ignore[misc]
        return [f.result() for f in futures]

    def _copy_or_stop(self, table: SnapshotTable) -> TableCopy:
        """``table``'s copy, not begun once another table's failed, and stopping the others'
        ranges in this process when it fails (the snapshot cannot commit either way)."""
        if self._readers.failed.is_set():
            raise CopyStoppedError(f"{table.table}: not copied, another table's copy failed")
        try:
            return self._copy_table(table)
        except BaseException:
            self._readers.failed.set()
            raise

    def on_spark(self, table: SnapshotTable) -> bool:
        """Whether ``table`` is copied on Spark (else in this process)."""
        return on_spark(table, engine=self.engine, resnapshot=self.tables is not None,
                        above=self.spark_above_bytes)  # fmt: skip

    def _copy_table(self, table: SnapshotTable) -> TableCopy:
        began = time.monotonic()
        target = self._copy_target(table)
        if target.renamed and self.tables is None:
            log.warning("%s: columns stored under other names, as Delta cannot hold them beside "
                        "the table's others: %s", table.table, target.renamed)  # fmt: skip
        if self.tables is None:
            staging.remove(target.uri)  # a copy of this point a failed run left, if any
        elif target.mapped:
            self.lake.align_state(table.table, needed=True)
        if self.tables is not None:
            # A re-snapshot's copy commits into the state table when it ends: prove the lock as
            # late as Spark allows (its app transaction keeps the state from going backwards)
            self.lake.check_writer()
        if self.on_spark(table):
            spark = self._spark()
            written = copy_on_spark(
                spark, table, target, task_for=lambda acc: self.copy_task(table, acc),
                max_tasks=self.tasks_per_table or int(spark.sparkContext.defaultParallelism),
                rows_per_task=self.rows_per_task,
            )  # fmt: skip
        else:
            written = copy_in_process(table, target, task=self.copy_task(table),
                                      max_tasks=self.tasks_per_table or usable_cpus(),
                                      rows_per_task=self.rows_per_task,
                                      readers=self._readers)  # fmt: skip
        if self.tables is not None:
            self._restart_changes(table)
            # its state now holds every change before the point: a hold in the lake's
            # quarantine ends (every quarantined change is before it)
            if release(self.lake, table.table, self.point.consistent_point):
                log.info("%s released from the lake's quarantine at %s", table.table,
                         self.point.consistent_point)  # fmt: skip
        stats = TableCopy(table=str(table.table), rows=written.rows, copy_bytes=written.copy_bytes,
                          tasks=written.tasks, blocks=table.blocks,
                          seconds=time.monotonic() - began, stored_as=target.renamed,
                          engine="spark" if self.on_spark(table) else "process")  # fmt: skip
        log.info("copied %s %s: %d rows in %d ranges of %d blocks, %.2fs", table.table,
                 "on Spark" if stats.engine == "spark" else "in process", stats.rows,
                 stats.tasks, table.blocks, stats.seconds)  # fmt: skip
        fault("table_copied")
        return stats

    def _copy_target(self, table: SnapshotTable) -> CopyTarget:
        """Where and how ``table``'s copy is written: each column under its lake name
        (``lake.column_names``): what a re-snapshotted table's lake recorded, else its own
        unless Delta would take it for another's."""
        plain = plain_schema(table_info(table))
        known = self.lake.known_schema(table.table) if self.tables is not None else None
        names = column_names.lake_names(plain.names, known)
        schema = lake_schema(table, names)
        mapped = mapping.needed(schema)
        # One version with the app transaction at the consistent point: readers see the table
        # before or after it; deletion vectors make the merges that follow cheap (unless the
        # lake is without them: ``Lake.state_config``; a re-snapshotted table keeps its own).
        return CopyTarget(uri=self._target(table), lake_names=names, schema=schema,
                          mapped=mapped,
                          configuration=self.lake.state_config(table.table, mapped=mapped),
                          app=self.lake.app, version=int(self.point.consistent_point),
                          resnapshot=self.tables is not None)  # fmt: skip

    def _spark(self) -> Any:
        if self.spark is None:
            raise ValueError("this snapshot has no Spark to copy on (spark=None): engine='process'")
        return self.spark()

    def _target(self, table: SnapshotTable) -> str:
        """Where Spark writes the table's copy: staged for an initial snapshot, the state table
        itself for a re-snapshot."""
        state = self.lake.paths.state(table.table)
        if self.tables is not None:
            return state
        return staging.staged_uri(state, self.point.consistent_point)

    def _restart_changes(self, table: SnapshotTable) -> None:
        """Only once the state of the consistent point is committed may the changelog let go of
        what came before it: it takes the table's columns as they are now (a re-snapshot is the
        fix for a change the lake could not follow)."""
        attnums = {c.name: c.attnum for c in table.columns}
        schema = numbered(changelog_schema(table_info(table)), attnums)
        restarted = self.lake.restart_changes(table.table, schema, self.point.consistent_point)
        if restarted != "kept":
            log.info("changelog of %s %s at %s", table.table, restarted,
                     self.point.consistent_point)  # fmt: skip

    def _publish(self, tables: Sequence[SnapshotTable]) -> None:
        """Make each staged copy its state table (``staging.publish``), one after the other,
        once every table is copied; the snapshot commits after the last."""
        for table in tables:
            state = self.lake.paths.state(table.table)
            self.lake.check_writer()
            files = staging.publish(state, self._target(table))
            log.info("published %s: %d files at %s", table.table, files,
                     self.point.consistent_point)  # fmt: skip
            self._restart_changes(table)
            fault("table_published")

    def copy_task(self, table: SnapshotTable, copied_bytes: Any = None) -> CopyTask:
        """The function the executors run for ``table``'s ranges (only inside ``run``: its
        parameters name the job's passfile instead of holding the password)."""
        from airflow_pglogrepl.postgres.snapshot_guard import readers_application_name

        if self._task_params is None:
            raise RuntimeError("SnapshotCopy.copy_task is only available inside run()")
        params = {
            **self._task_params,
            "application_name": readers_application_name(self.point.snapshot_name),
        }
        return CopyTask(
            params,
            self.point.snapshot_name,
            table,
            chunk_bytes=self.chunk_bytes,
            copied_bytes=copied_bytes,
            lock_timeout_ms=int(self.lock_timeout_s * 1000),
        )

    def _commit_initial(self, result: SnapshotResult) -> None:
        rows = {c.table: c.rows for c in result.tables}
        cp = self.point.consistent_point
        # The commit point: from here on the snapshot is the lake's first entry, and the drain
        # starts at exactly this LSN (the slot's confirmed_flush_lsn).
        self.lake.record(kind="snapshot", start=cp, end=cp, changes=sum(rows.values()),
                         tables=rows)  # fmt: skip
        log.info("snapshot of slot %s committed at %s", self.point.slot, cp)

    def _check_not_overtaken(self, tables: Sequence[SnapshotTable]) -> None:
        """A re-snapshot older than a table's state would move it back: refused."""
        cp = self.point.consistent_point
        for table in tables:
            current = self.lake.state_version(table.table)
            if current is not None and current > cp:
                raise LakeMismatchError(
                    f"the state of {table.table} is already at {current}, past this snapshot's "
                    f"consistent point {cp}. Run the re-snapshot again"
                )

    def _discard(self, tables: Sequence[SnapshotTable]) -> None:
        """After a failed initial snapshot, remove its staged copies and the state tables it
        published (local or remote). Nothing else is in the lake yet; what cannot be removed
        now, the next initial snapshot removes (``remove_leftovers``)."""
        if self.lake.position() is not None:
            return
        cp = self.point.consistent_point
        for table in tables:
            try:
                staging.remove(self._target(table))
                if self.lake.state_version(table.table) == cp:
                    staging.remove(self.lake.paths.state(table.table))
            except Exception:  # the failure being raised matters more than this one
                log.warning("could not remove what the snapshot of %s left", table.table,
                            exc_info=True)  # fmt: skip
