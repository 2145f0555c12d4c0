"""One table's heap copied in block ranges on Spark's executors, inside an exported snapshot,
into Arrow batches typed exactly as the drain types them.

Each table's heap is split into ctid block ranges (``plan_ranges``), one Spark task per range. A
task runs on an executor, opens its own session, imports the snapshot and reads its range
through ADBC, which parses the rows in C into Arrow record batches of about ``CHUNK_BYTES``.
Integers, floats, booleans and text-like columns are read in their binary form, already the
lake's values; every other column is read as its type's text output (what pgoutput sends) and
converted by the drain's own mapping (``changelog.types.arrow_from_text_array``): one
conversion, so a snapshot and a drain store every value alike. Tables are copied side by side.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.types import (
    UnconvertibleTextError,
    arrow_from_text_array,
    arrow_schema,
)
from airflow_pglogrepl.exceptions import UnstorableValueError
from airflow_pglogrepl.faults import fault, pause
from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.values import OID, value_type

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.postgres.snapshot import SnapshotTable

__all__ = ["CHUNK_BYTES", "BlockRange", "CopyTask", "lake_batch", "plain_schema", "plan_ranges",
           "read_plan", "table_info"]  # fmt: skip

CHUNK_BYTES = 8 << 20  # Arrow fetched, converted and handed to Spark at a time, per task
# Rows per heap block assumed for a table the planner never measured (reltuples = -1); only
# how finely it is split depends on it.
UNKNOWN_ROWS_PER_BLOCK = 60

# Types read in their binary form, cast to the named ``pg_catalog`` type: ADBC turns them into
# exactly the lake's values (every integer is int64 there). Every other type is read as text.
_BINARY: dict[int, str] = {
    OID.INT2: "int8", OID.INT4: "int8", OID.INT8: "int8", OID.FLOAT4: "float4",
    OID.FLOAT8: "float8", OID.BOOL: "bool", OID.TEXT: "text", OID.VARCHAR: "text",
    OID.BPCHAR: "bpchar", OID.NAME: "name",
}  # fmt: skip


# -- planning, on the driver -------------------------------------------------------------------


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
    invisible in the snapshot anyway). A partitioned table's ranges cut each of its leaves
    at the same block numbers (``SnapshotTable.span``).
    """
    if max_tasks < 1 or rows_per_task < 1:
        raise ValueError("max_tasks and rows_per_task must be at least 1")
    blocks = table.span
    wanted = math.ceil(estimated_rows(table) / rows_per_task)
    count = max(1, min(max_tasks, wanted, blocks))
    if count == 1:
        return [BlockRange(0, None)]
    step = math.ceil(blocks / count)
    starts = list(range(0, blocks, step))
    return [
        BlockRange(start, starts[i + 1] if i + 1 < len(starts) else None)
        for i, start in enumerate(starts)
    ]


def table_info(table: SnapshotTable) -> TableInfo:
    """The table as the drain's decoder would describe it (same columns, key, types)."""
    columns = [
        ColumnInfo(
            c.name,
            c.type_oid,
            c.type_modifier,
            c.is_key,
            value_type(c.type_oid, (c.base_namespace, c.base_name)),
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


# -- the copy, on executors ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Column:
    """How one column is read (``cast``: a binary type, None: text) and converted."""

    name: str
    value_type: int | None
    type_modifier: int
    cast: str | None


def read_plan(info: TableInfo) -> tuple[_Column, ...]:
    return tuple(
        _Column(c.name, c.value_type_oid, c.type_modifier,
                _BINARY.get(c.value_type_oid) if c.value_type_oid is not None else None)
        for c in info.columns
    )  # fmt: skip


def lake_batch(
    batch: pa.RecordBatch, columns: Sequence[_Column], schema: pa.Schema, table: str = ""
) -> pa.RecordBatch:
    """A batch as the reader fetched it (``read_plan``'s casts) as a batch of ``schema``.

    Text columns are converted by the drain's mapping, value for value the same; a value the
    lake cannot hold is refused with the drain's message (``UnstorableValueError``).
    """
    import pyarrow as pa

    arrays = []
    for i, col in enumerate(columns):
        target = schema.field(i).type
        values = batch.column(i)
        if col.cast is None:
            try:
                values = arrow_from_text_array(values, col.value_type, col.type_modifier, target)
            except UnconvertibleTextError as exc:
                raise UnstorableValueError(table, col.name, exc.text, exc.reason) from None
        arrays.append(values if values.type == target else values.cast(target))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class CopyTask:
    """The function Spark runs per range (``mapInArrow``): copy the range, yield Arrow batches.

    Pickled to the executors with what it needs: the source's libpq parameters, the snapshot's
    name and the table's description. The parameters travel without the password
    (``passfile.travelling_params``): Spark's RPC and event logs carry task bytes, and a
    standalone cluster does not authenticate its RPC by default. Nor are they put in Spark
    configuration or the executors' environment, where the UI would show them.
    """

    def __init__(
        self,
        params: dict[str, str],
        snapshot_name: str,
        table: SnapshotTable,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        copied_bytes: Any = None,
        lock_timeout_ms: int = 0,
    ) -> None:
        if params.get("password"):
            raise ValueError("CopyTask is pickled to executors: pass travelling_params(...)")
        self.params = params
        self.snapshot_name = snapshot_name
        self.table = table
        self.chunk_bytes = chunk_bytes
        self.copied_bytes = copied_bytes  # a Spark accumulator, or None
        self.lock_timeout_ms = lock_timeout_ms

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                if row["start"] > 0:
                    pause("before_later_range")
                yield from self.copy(BlockRange(row["start"], row["stop"]))

    def copy(self, block_range: BlockRange) -> Iterator[pa.RecordBatch]:
        """One range's rows, a batch at a time (memory stays at about two batches)."""
        from airflow_pglogrepl.postgres.snapshot import SnapshotReader

        info = table_info(self.table)
        schema = plain_schema(info)
        columns = read_plan(info)
        reader = SnapshotReader(self.params, lock_timeout_ms=self.lock_timeout_ms)
        total = 0
        batches = reader.arrow_batches(
            self.snapshot_name,
            self.table,
            [c.cast for c in columns],
            start_block=block_range.start,
            stop_block=block_range.stop,
            batch_bytes=self.chunk_bytes,
        )
        for batch in batches:
            total += batch.nbytes
            yield lake_batch(batch, columns, schema, str(self.table.table))
            fault("mid_copy")
        if self.copied_bytes is not None:
            self.copied_bytes.add(total)


def plain_schema(info: TableInfo) -> pa.Schema:
    """The table's Arrow schema without metadata (what Spark hands back and checks against)."""
    return arrow_schema(info).remove_metadata()
