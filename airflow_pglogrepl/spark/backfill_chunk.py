"""One chunk of an online backfill: a range of heap blocks read in the chunk's exported
snapshot by Spark's tasks and appended to the backfill's rows table as one commit carrying the
chunk's number (``txnVersion``), so that a chunk committed twice is stored once.

A partitioned table's chunk is the same block numbers of every leaf (ctids are per leaf, and
PostgreSQL scans each leaf's range alone), so its chunks are sized by the rows a block number
holds across the leaves, and the last one, open-ended, reaches past the biggest leaf.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake import backfill as record
from airflow_pglogrepl.lake import column_names, mapping, staging
from airflow_pglogrepl.lake.lake import Lake

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from airflow_pglogrepl.postgres.snapshot import SnapshotTable

__all__ = ["LOCK_TIMEOUT_MS", "blocks_per_chunk", "split", "write_chunk"]

LOCK_TIMEOUT_MS = 60_000  # a reader queued behind an exclusive lock request gives up, retried


def blocks_per_chunk(table: SnapshotTable, chunk_rows: int) -> int:
    """The block numbers a chunk of about ``chunk_rows`` rows spans (across a partitioned
    table's leaves: each number is a block of each leaf as big)."""
    from airflow_pglogrepl.spark.range_copy import UNKNOWN_ROWS_PER_BLOCK

    per_block = (
        table.reltuples / table.relpages
        if table.reltuples > 0 and table.relpages > 0
        else UNKNOWN_ROWS_PER_BLOCK
    )
    leaves = table.blocks / table.span if table.span > 0 else 1.0  # blocks a number stands for
    return max(1, int(chunk_rows / max(per_block * max(leaves, 1.0), 1.0)))


def write_chunk(spark: Any, lake: Lake, source_params: dict[str, str], plan: record.Plan,
                table: SnapshotTable, snapshot: str, done: int,
                blocks: tuple[int, int | None], *, known: pa.Schema | None) -> int:  # fmt: skip
    """Chunk ``done + 1`` (heap blocks ``blocks``, the end open when None) read in exported
    snapshot ``snapshot`` and committed to the backfill's rows under the lake's names for
    the columns (``known``: the lake's schema of the table, read before the snapshot was
    taken); the rows it appended."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from airflow_pglogrepl.postgres.passfile import travelling_params
    from airflow_pglogrepl.postgres.snapshot_guard import readers_application_name
    from airflow_pglogrepl.spark.range_copy import CopyTask, plain_schema, table_info
    from airflow_pglogrepl.spark.snapshot_spark import with_metadata
    from airflow_pglogrepl.spark.snapshot_target import column_metadata

    info = table_info(table)
    plain = plain_schema(info)
    lake_names = column_names.lake_names(plain.names, known)
    uri = record.rows_uri(lake, plan)
    with travelling_params(source_params) as params:
        task = CopyTask({**params, "application_name": readers_application_name(snapshot)},
                        snapshot, table, lock_timeout_ms=LOCK_TIMEOUT_MS)  # fmt: skip
        ranges = split(*blocks, int(spark.sparkContext.defaultParallelism))
        bounds = spark.sparkContext.parallelize(ranges, len(ranges))
        frame = spark.createDataFrame(bounds, "start long, stop long")
        copied = frame.mapInArrow(task, from_arrow_schema(plain)).toDF(*lake_names.values())
        out = with_metadata(copied, column_metadata(table, lake_names))
        writer = out.write.format("delta").mode("append")
        if done == 0:
            staging.remove(uri)  # what a backfill of the same start left, if any
            mapped = mapping.needed(pa.schema([f.with_name(lake_names[f.name]) for f in plain]))
            writer = writer.options(**lake.state_config(table.table, mapped=mapped))
        lake.check_writer()
        writer.option("txnAppId", lake.app).option("txnVersion", str(done + 1)).save(uri)
    return rows_committed(spark, uri)


def rows_committed(spark: SparkSession, uri: str) -> int:
    """The rows the newest commit of ``uri`` appended, from its log entry: reading the table
    would count every chunk again after each one."""
    from delta.tables import DeltaTable

    newest = DeltaTable.forPath(spark, uri).history(1).select("operationMetrics").first()
    metrics = (newest[0] if newest is not None else None) or {}
    return int(metrics.get("numOutputRows", 0))


def split(first: int, stop: int | None, parts: int) -> list[tuple[int, int | None]]:
    """``[first, stop)`` in up to ``parts`` block ranges (one, open-ended, when ``stop`` is
    None: the rows of blocks the table grew by since the count are read too)."""
    if stop is None:
        return [(first, None)]
    size = max(1, -(-(stop - first) // max(1, parts)))
    return [(s, min(s + size, stop)) for s in range(first, stop, size)]
