"""Copy published tables into the sink's ``state/`` on Spark, inside a slot's exported snapshot.

The copy is the lake's starting point: the rows the tables held at the slot's consistent point,
typed exactly as the drain types them, committed in the sink's commit log at that point, so the
drain continues at the slot's first change with no gap and no overlap.

How the work is cut: each table's heap is split into ctid block ranges (``plan_ranges``), one
Spark task per range. A task runs on an executor, opens its own session, imports the snapshot and
streams its range with ``COPY ... (FORMAT csv)``; pyarrow's CSV reader turns each chunk of about
``CHUNK_BYTES`` into typed Arrow columns at C speed, and only the types whose values the decoder
reshapes (json, bytea, intervals, arrays, inet, unconstrained numeric ...) go through the
decoder's own Python converters, value by value. Spark writes each task's rows as its own
Parquet part files under staging; tables are copied side by side.

How it becomes visible (``Sink``): nothing under ``state/`` changes until every table is staged;
then one commit record (``kind="snapshot"``, start = end = consistent point) is written
atomically, which is the commit point, and the staged directories are swapped in as ``state/``
with their state records. A crash before the record leaves only staging, which ``recover()``
deletes; after it, ``recover()`` finishes the swap.

Re-snapshotting some tables (``tables=``; a table added to the publication later) uses a
temporary slot's snapshot instead and replaces only those tables' state, each with a state record
at that snapshot's consistent point (``state.install_state``): the changelog the drain keeps
writing supplies everything after it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import PgLogReplError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.changes import ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.schema import arrow_type, arrow_value
from airflow_pglogrepl.pgoutput.values import OID, TYPNAME_OIDS, text_converter
from airflow_pglogrepl.spark.sink import META, CommitRecord, Sink, table_dir, window_id
from airflow_pglogrepl.spark.state import install_state, state_lsn
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.hooks.snapshot import CatalogColumn, SnapshotTable

log = logging.getLogger("airflow_pglogrepl.snapshot")

FAULT_ENV = "PGLOGREPL_FAULT"  # tests only: die abruptly at a named point (see _fault)
DEFAULT_ROWS_PER_TASK = 1_000_000
CHUNK_BYTES = 8 * 1024 * 1024  # COPY text converted (and handed to Spark) at a time, per task
# Rows per heap block assumed for a table the planner never measured (reltuples = -1); only
# how finely it is split depends on it.
UNKNOWN_ROWS_PER_BLOCK = 60
# pgoutput describes a column's type in a Type message only from this OID on (user types);
# built-in types it names by OID alone (FirstGenbkiObjectId in src/include/access/transam.h).
_FIRST_USER_OID = 10000

# Types whose text pyarrow's CSV reader parses into exactly what the decoder would produce.
_PARSED = frozenset({OID.BOOL, OID.INT2, OID.INT4, OID.INT8, OID.FLOAT8, OID.DATE,
                     OID.TIMESTAMP, OID.TIMESTAMPTZ})  # fmt: skip
# Types the decoder keeps as the text PostgreSQL printed (uuid: uuid_out's form is str(UUID)).
_VERBATIM = frozenset({OID.TEXT, OID.VARCHAR, OID.BPCHAR, OID.NAME, OID.UUID, None})


class SinkNotEmptyError(PgLogReplError):
    """An initial snapshot was asked for a sink that already holds data."""


# -- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockRange:
    """Heap blocks ``[start, stop)``; ``stop`` None: to the end of the table, however long."""

    start: int
    stop: int | None


def estimated_rows(table: SnapshotTable) -> float:
    """Rows the table holds now, scaled from the planner's statistics to its current size."""
    if table.reltuples >= 0 and table.relpages > 0:
        return table.reltuples / table.relpages * table.blocks
    if table.reltuples >= 0 and table.blocks <= max(table.relpages, 1):
        return table.reltuples
    return float(table.blocks * UNKNOWN_ROWS_PER_BLOCK)


def plan_ranges(table: SnapshotTable, *, max_tasks: int, rows_per_task: int) -> list[BlockRange]:
    """Split a table into at most ``max_tasks`` ranges of about ``rows_per_task`` rows.

    Ranges are equal block counts (rows per block vary little within a table); the last is
    open-ended, so rows in blocks added after the size was read are never missed (they are
    invisible in the snapshot anyway). A partitioned table is one range: ctids are per
    partition.
    """
    if max_tasks < 1 or rows_per_task < 1:
        raise ValueError("max_tasks and rows_per_task must be at least 1")
    blocks = table.blocks
    wanted = math.ceil(estimated_rows(table) / rows_per_task)
    count = max(1, min(max_tasks, wanted, blocks))
    if table.relkind == "p" or count == 1:
        return [BlockRange(0, None)]
    step = math.ceil(blocks / count)
    starts = list(range(0, blocks, step))
    return [
        BlockRange(start, starts[i + 1] if i + 1 < len(starts) else None)
        for i, start in enumerate(starts)
    ]


def value_type(column: CatalogColumn) -> int | None:
    """The type the drain converts a column's values as (``PgOutputStream._value_type``):
    the column's own type when the decoder converts it, a domain's base type when that is a
    built-in, else None (the value stays PostgreSQL's text)."""
    if text_converter(column.type_oid) is not None:
        return column.type_oid
    if column.type_oid >= _FIRST_USER_OID and column.base_namespace == "pg_catalog":
        return TYPNAME_OIDS.get(column.base_name)
    return None


def table_info(table: SnapshotTable) -> TableInfo:
    """The table as the drain's decoder would describe it (same columns, key, types)."""
    columns = [
        ColumnInfo(
            c.name,
            c.type_oid,
            c.type_modifier,
            c.is_key,
            value_type(c),
            f"{c.base_namespace}.{c.base_name}",
        )
        for c in table.columns
    ]
    return TableInfo(
        table.table.schema,
        table.table.name,
        columns,
        relation_id=table.relid,
        replica_identity=table.replica_identity,
    )


def describe(info: TableInfo) -> dict[str, Any]:
    """What a commit record keeps about a table: the drain's ``ChangelogBatch.describe()``."""
    return {
        "schema": info.schema,
        "table": info.table,
        "columns": list(info.names),
        "key": list(info.key_names),
        "replica_identity": info.replica_identity,
    }


# -- the copy, on executors ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Column:
    """How one column's CSV text becomes its Arrow values."""

    name: str
    value_type: int | None
    type_modifier: int
    mode: str  # "parsed" (pyarrow parses it), "float4", "verbatim" or "python"


def _column_plan(info: TableInfo) -> tuple[_Column, ...]:
    import pyarrow as pa

    plan = []
    for column in info.columns:
        oid, mod = column.value_type_oid, column.type_modifier
        if oid in _PARSED:
            mode = "parsed"
        elif oid == OID.FLOAT4:
            mode = "float4"  # parsed as float64, then rounded as pa.array rounds a Python float
        elif oid == OID.NUMERIC and pa.types.is_decimal(arrow_type(oid, mod)):
            mode = "parsed"
        elif oid in _VERBATIM:
            mode = "verbatim"
        else:
            mode = "python"
        plan.append(_Column(column.name, oid, mod, mode))
    return tuple(plan)


def arrow_batches(
    data: bytes | bytearray, columns: Sequence[_Column], schema: pa.Schema
) -> pa.Table:
    """CSV text of whole rows (``COPY ... (FORMAT csv)``) as an Arrow table of ``schema``.

    A chunk pyarrow cannot parse into a typed column (an infinite date, a NaN numeric ...) is
    read again as text and converted entirely by the decoder's converters: they keep or reject
    exactly what the drain keeps or rejects, with its message.
    """
    import pyarrow as pa

    names = [f"c{i}" for i in range(len(columns))]
    typed = {
        name: (pa.float64() if col.mode == "float4" else schema.field(i).type)
        if col.mode in ("parsed", "float4")
        else pa.string()
        for i, (name, col) in enumerate(zip(names, columns, strict=True))
    }
    buffer = pa.py_buffer(bytes(data))
    try:
        parsed = _read_csv(buffer, names, typed)
        slow = {i for i, col in enumerate(columns) if col.mode == "python"}
    except pa.ArrowInvalid:
        parsed = _read_csv(buffer, names, dict.fromkeys(names, pa.string()))
        slow = {i for i, col in enumerate(columns) if col.mode != "verbatim"}
    arrays = []
    for i, col in enumerate(columns):
        target = schema.field(i).type
        values = parsed.column(i)
        if i in slow:
            convert = text_converter(col.value_type) if col.value_type is not None else None
            oid, mod = col.value_type, col.type_modifier
            arrays.append(
                pa.array(
                    [
                        None
                        if text is None
                        else arrow_value(convert(text) if convert else text, oid, mod)
                        for text in values.to_pylist()
                    ],
                    type=target,
                )
            )
        elif col.mode == "float4":
            arrays.append(values.cast(pa.float32(), safe=False))
        else:
            arrays.append(values)
    return pa.Table.from_arrays(arrays, schema=schema)


def _read_csv(buffer: Any, names: list[str], types: dict[str, Any]) -> pa.Table:
    from pyarrow import csv

    return csv.read_csv(
        buffer,
        read_options=csv.ReadOptions(
            column_names=names, use_threads=False, block_size=max(buffer.size + 1, 1 << 20)
        ),
        # PostgreSQL's CSV: "" doubles a quote, values may hold newlines, a row of one NULL
        # column is an empty line.
        parse_options=csv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False),
        # NULL is an unquoted empty field; "" is the empty string; booleans print as t/f.
        convert_options=csv.ConvertOptions(
            column_types=types,
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            true_values=["t"],
            false_values=["f"],
        ),
    )


class CopyTask:
    """The function Spark runs per range (``mapInArrow``): copy the range, yield Arrow batches.

    Pickled to the executors with what it needs: the source's libpq parameters, the snapshot's
    name and the table's description. Connection parameters travel inside the task, never in
    Spark configuration or the environment of the executors, where the UI would show them.
    """

    def __init__(
        self,
        params: dict[str, str],
        snapshot_name: str,
        table: SnapshotTable,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        copied_bytes: Any = None,
    ) -> None:
        self.params = params
        self.snapshot_name = snapshot_name
        self.table = table
        self.chunk_bytes = chunk_bytes
        self.copied_bytes = copied_bytes  # a Spark accumulator, or None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                yield from self.copy(BlockRange(row["start"], row["stop"]))

    def copy(self, block_range: BlockRange) -> Iterator[pa.RecordBatch]:
        """One range's rows, converted chunk by chunk (memory stays at about two chunks)."""
        from airflow_pglogrepl.hooks.snapshot import SnapshotReader

        info = table_info(self.table)
        schema = _plain_schema(info)
        columns = _column_plan(info)
        reader = SnapshotReader(self.params)
        total = 0
        with reader.transaction(self.snapshot_name) as conn:
            buffer = bytearray()
            rows = reader.copy_csv(
                conn, self.table, start_block=block_range.start, stop_block=block_range.stop
            )
            for data in rows:
                buffer += data
                if len(buffer) >= self.chunk_bytes:
                    total += len(buffer)
                    yield from arrow_batches(buffer, columns, schema).to_batches()
                    buffer = bytearray()
                    _fault("mid_copy")
            if buffer:
                total += len(buffer)
                yield from arrow_batches(buffer, columns, schema).to_batches()
        if self.copied_bytes is not None:
            self.copied_bytes.add(total)


def _plain_schema(info: TableInfo) -> pa.Schema:
    """The table's Arrow schema without metadata (what Spark hands back and checks against)."""
    return info.arrow_schema().remove_metadata()


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
    copy_bytes: int = 0
    tasks: int = 0
    blocks: int = 0
    seconds: float = 0.0


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
                }
                for t in self.tables
            },
        }


def snapshot_commit(sink: Sink, slot: str, consistent_point: LSN) -> CommitRecord | None:
    """The sink's committed initial snapshot of ``slot`` at ``consistent_point``, if any."""
    for record in sink.commits():
        if record.kind == "snapshot" and record.slot == slot and record.end == consistent_point:
            return record
    return None


def existing_snapshot(sink: Sink, slot: str) -> CommitRecord | None:
    """The sink's initial snapshot of ``slot`` (its first commit), if it has one."""
    commits = sink.commits()
    first = commits[0] if commits else None
    if first is not None and first.kind == "snapshot" and first.slot == slot:
        return first
    return None


def resolve(sink: Sink, slot: str, consistent_point: LSN | None = None) -> dict[str, Any]:
    """Recover the sink and say where it stands for ``slot``.

    After a snapshot run died, this finishes it if its commit record was written and removes
    what it staged otherwise, so no partial ``state/`` remains. Returns ``commits`` (how many the
    sink holds), ``snapshot_lsn`` (the consistent point of its initial snapshot of ``slot``, or
    None) and, with ``consistent_point``, ``committed`` (whether that snapshot is committed).
    """
    sink.recover()  # publishes committed snapshots, deletes staging without a record
    existing = existing_snapshot(sink, slot)
    status: dict[str, Any] = {
        "commits": len(sink.commits()),
        "snapshot_lsn": existing.end_lsn if existing else None,
    }
    if consistent_point is not None:
        status["committed"] = snapshot_commit(sink, slot, consistent_point) is not None
    return status


def temporary_slot_name(slot: str) -> str:
    """A name for the temporary slot of a re-snapshot next to ``slot`` (unique per process)."""
    suffix = f"_rs{os.getpid()}"
    return slot[: 63 - len(suffix)] + suffix


def check_empty_sink(sink: Sink) -> None:
    """Refuse an initial snapshot into a sink that already holds committed data.

    Leftover bookkeeping of an interrupted snapshot (staging, state records without any commit)
    is not data and is removed; ``state/`` or ``changes/`` without a commit record are someone
    else's files and stop the run.
    """
    last = sink.recover()
    if last is not None:
        raise SinkNotEmptyError(
            f"sink {sink.root} already holds commits up to {last.end_lsn} (slot {last.slot!r}, "
            f"{last.kind}); an initial snapshot starts a new sink. Fix: drain it as it is, "
            f"re-snapshot single tables (tables=...), or use an empty sink"
        )
    storage = sink.storage
    for name in ("state", "changes"):
        path = storage.join(sink.root, name)
        if storage.list_names(path):
            raise SinkNotEmptyError(
                f"sink {sink.root} has files under {name}/ but no commit record: they were not "
                f"written by this provider's commit protocol. Fix: move them away or use an "
                f"empty sink"
            )
    for name in ("state", "state_next"):
        storage.delete(storage.join(sink.root, META, name))


class SnapshotCopy:
    """Copy the published tables at ``point`` into ``sink`` and commit them there.

    ``reader_params`` are the source's libpq parameters (the tasks connect with them). With
    ``tables`` only those tables are re-snapshotted into an existing sink; otherwise the sink
    must be empty and the whole publication is copied and committed at the consistent point.
    The snapshot must stay exported (its session open) until ``run`` returns.
    """

    def __init__(
        self,
        *,
        spark: Any,
        sink: Sink,
        reader_params: dict[str, str],
        point: SnapshotPoint,
        publications: Sequence[str],
        tables: Sequence[TableRef] | None = None,
        tasks_per_table: int | None = None,
        rows_per_task: int = DEFAULT_ROWS_PER_TASK,
        parallelism: int = 4,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if not publications:
            raise ValueError("at least one publication is needed")
        self.spark = spark
        self.sink = sink
        self.reader_params = dict(reader_params)
        self.point = point
        self.publications = list(publications)
        self.tables = list(tables) if tables is not None else None
        self.tasks_per_table = tasks_per_table
        self.rows_per_task = rows_per_task
        self.parallelism = max(1, parallelism)
        self.chunk_bytes = chunk_bytes

    def run(self) -> SnapshotResult:
        """Copy, then commit; on failure remove what was staged and re-raise."""
        result = SnapshotResult(
            slot=self.point.slot,
            consistent_point=self.point.consistent_point,
            snapshot_name=self.point.snapshot_name,
            mode="initial" if self.tables is None else "tables",
        )
        if self.tables is None:
            check_empty_sink(self.sink)
        else:
            if self.sink.recover() is None:
                raise PgLogReplError(
                    f"sink {self.sink.root} holds no commit yet: take an initial snapshot of the "
                    f"whole publication first (tables=None)"
                )
            for table in self.tables:
                self._remove_stale_snapshots(table_dir(table))
        began = time.monotonic()
        from airflow_pglogrepl.hooks.snapshot import SnapshotReader

        reader = SnapshotReader(self.reader_params)
        with reader.transaction(self.point.snapshot_name) as conn:
            tables = reader.published_tables(conn, self.publications, self.tables)
        result.plan_s = time.monotonic() - began
        began = time.monotonic()
        staged = {table_dir(t.table): self._staging(t.table) for t in tables}
        try:
            result.tables = self._copy_all(tables, staged)
            result.copy_s = time.monotonic() - began
            _fault("after_copy")
            began = time.monotonic()
            if self.tables is None:
                self._commit_initial(tables, result)
            else:
                self._install_tables(staged)
        except BaseException:
            self._discard(staged)
            raise
        result.commit_s = time.monotonic() - began
        result.committed = True
        _fault("after_commit")
        return result

    # -- steps --------------------------------------------------------------------------------

    def _staging(self, table: TableRef) -> str:
        window = window_id(self.point.consistent_point)
        if self.tables is None:
            return self.sink.staging_dir(window, table)
        storage = self.sink.storage
        return storage.join(
            self.sink.root, META, "state_next", table_dir(table), f"{window}-snapshot"
        )

    def _copy_all(self, tables: Sequence[SnapshotTable], staged: dict[str, str]) -> list[TableCopy]:
        if not tables:
            return []
        max_tasks = self.tasks_per_table or int(self.spark.sparkContext.defaultParallelism)
        workers = min(len(tables), self.parallelism)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="snapshot") as pool:
            futures = [
                pool.submit(self._copy_table, t, staged[table_dir(t.table)], max_tasks)
                for t in tables
            ]
            return [f.result() for f in futures]

    def _copy_table(self, table: SnapshotTable, target: str, max_tasks: int) -> TableCopy:
        from pyspark.sql.pandas.types import from_arrow_schema

        began = time.monotonic()
        ranges = plan_ranges(table, max_tasks=max_tasks, rows_per_task=self.rows_per_task)
        context = self.spark.sparkContext
        copied = context.accumulator(0)
        task = CopyTask(
            self.reader_params,
            self.point.snapshot_name,
            table,
            chunk_bytes=self.chunk_bytes,
            copied_bytes=copied,
        )
        spark_schema = from_arrow_schema(_plain_schema(table_info(table)))
        context.setJobDescription(f"pglogrepl snapshot {table.table} ({len(ranges)} ranges)")
        bounds = context.parallelize([(r.start, r.stop) for r in ranges], len(ranges))
        frame = self.spark.createDataFrame(bounds, "start long, stop long")
        frame.mapInArrow(task, spark_schema).write.mode("overwrite").parquet(target)
        # Counted from the Parquet footers Spark just wrote: exact even if a task was retried.
        rows = int(self.spark.read.parquet(target).count())
        stats = TableCopy(
            table=str(table.table),
            rows=rows,
            copy_bytes=int(copied.value),
            tasks=len(ranges),
            blocks=table.blocks,
            seconds=time.monotonic() - began,
        )
        log.info(
            "copied %s: %d rows in %d ranges of %d blocks, %.2fs",
            table.table, rows, len(ranges), table.blocks, stats.seconds,
        )  # fmt: skip
        return stats

    def _commit_initial(self, tables: Sequence[SnapshotTable], result: SnapshotResult) -> None:
        rows = {c.table: c.rows for c in result.tables}
        described = {}
        for table in tables:
            info = describe(table_info(table))
            info["snapshot_rows"] = rows.get(str(table.table), 0)
            described[table_dir(table.table)] = info
        cp = str(self.point.consistent_point)
        record = CommitRecord(
            kind="snapshot",
            slot=self.point.slot,
            start_lsn=cp,
            end_lsn=cp,
            transactions=0,
            changes=sum(rows.values()),
            files={},
            tables=described,
        )
        # The commit point: from here on the snapshot is the sink's first commit, and the drain
        # starts at exactly this LSN (the slot's confirmed_flush_lsn).
        self.sink.commit(record)
        log.info("snapshot of slot %s committed at %s", self.point.slot, cp)

    def _install_tables(self, staged: dict[str, str]) -> None:
        cp = self.point.consistent_point
        for name in staged:
            current = state_lsn(self.sink, name)
            if current is not None and current > cp:
                raise PgLogReplError(
                    f"the state of {name} is already at {current}, past this snapshot's "
                    f"consistent point {cp}: a drain ran concurrently. Run the re-snapshot "
                    f"again while no drain runs"
                )
        for name, path in staged.items():
            install_state(self.sink, name, cp, path)

    def _remove_stale_snapshots(self, table: str) -> None:
        """Directories earlier re-snapshots of ``table`` staged but never installed."""
        storage = self.sink.storage
        directory = storage.join(self.sink.root, META, "state_next", table)
        path = self.sink.state_record_path(table)
        pending = json.loads(storage.read_text(path)).get("next") if storage.exists(path) else None
        for name in storage.list_names(directory):
            full = storage.join(directory, name)
            if name.endswith("-snapshot") and full != pending:
                storage.delete(full)

    def _discard(self, staged: dict[str, str]) -> None:
        """Remove what this run staged, unless it is committed (then ``recover()`` finishes)."""
        storage = self.sink.storage
        cp = self.point.consistent_point
        try:
            if self.tables is None:
                if snapshot_commit(self.sink, self.point.slot, cp) is None:
                    storage.delete(self.sink.staging_dir(window_id(cp)))
            else:
                for name, path in staged.items():
                    if state_lsn(self.sink, name) != cp:
                        storage.delete(path)
        except Exception:  # the original error matters more; recover() cleans up later
            log.exception("could not remove the staged snapshot; the next run removes it")


def _fault(point: str) -> None:
    """Tests inject crashes here: ``PGLOGREPL_FAULT=<point>[:<n>]`` kills the process abruptly
    the n-th time (default first) it passes ``point`` (``mid_copy`` in a Spark task,
    ``after_copy`` and ``after_commit`` in the driver); nothing is cleaned up."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    counter = f"_PGLOGREPL_FAULT_COUNT_{point}"
    count = int(os.environ.get(counter, "0")) + 1
    os.environ[counter] = str(count)
    if count >= int(nth or "1"):
        os._exit(137)
