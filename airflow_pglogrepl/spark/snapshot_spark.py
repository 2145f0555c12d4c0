"""One table's snapshot copy on Spark: its block ranges as tasks (``range_copy.CopyTask``), the
rows written by Delta's own writer as one version of the copy's target.

Spark is the way for big tables: its tasks read ranges side by side, on as many executors as
the cluster has. For small ones its start costs more than the copy (``spark.snapshot_arrow``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake.delta import REWRITTEN
from airflow_pglogrepl.lake.schema_commits import spell_out_mapping
from airflow_pglogrepl.spark.range_copy import CopyTask, plain_schema, plan_ranges, table_info
from airflow_pglogrepl.spark.snapshot_target import CopyTarget, Written, column_metadata

if TYPE_CHECKING:
    from airflow_pglogrepl.postgres.snapshot import SnapshotTable

__all__ = ["copy_on_spark", "with_metadata"]

log = logging.getLogger("airflow_pglogrepl.snapshot")


def with_metadata(frame: Any, described: Mapping[str, Mapping[str, str]]) -> Any:
    """``frame`` with each column's metadata set to ``described``'s (a column not named there
    keeps its own)."""
    from airflow_pglogrepl.merge.lineage import column

    return frame.select(
        *(
            column(c).alias(c, metadata=dict(described[c])) if described.get(c) else column(c)
            for c in frame.columns
        )
    )


def copy_on_spark(spark: Any, table: SnapshotTable, target: CopyTarget, *,
                  task_for: Any, max_tasks: int, rows_per_task: int) -> Written:  # fmt: skip
    """Copy ``table`` into ``target`` on Spark, in at most ``max_tasks`` ranges of about
    ``rows_per_task`` rows; ``task_for(accumulator)`` gives the function the tasks run.

    One overwrite version with the app transaction: readers see the table before or after it;
    its properties are the target's (deletion vectors, column mapping, no log cleanup)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    ranges = plan_ranges(table, max_tasks=max_tasks, rows_per_task=rows_per_task)
    context = spark.sparkContext
    copied = context.accumulator(0)
    task: CopyTask = task_for(copied)
    spark_schema = from_arrow_schema(plain_schema(table_info(table)))
    context.setJobDescription(f"pglogrepl snapshot {table.table} ({len(ranges)} ranges)")
    bounds = context.parallelize([(r.start, r.stop) for r in ranges], len(ranges))
    frame = spark.createDataFrame(bounds, "start long, stop long")
    rows = frame.mapInArrow(task, spark_schema).toDF(*target.lake_names.values())
    rows = with_metadata(rows, column_metadata(table, target.lake_names))
    (
        rows.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .options(**target.configuration)
        .option("txnAppId", target.app)
        .option("txnVersion", str(target.version))
        .option("userMetadata", REWRITTEN)  # (a history begins again here)
        .save(target.uri)
    )
    if target.resnapshot and target.mapped:  # (a state Spark just created: not staged)
        spell_out_mapping(target.uri)
    # Counted from the version just written (file statistics): exact even if a task was retried
    count = int(spark.read.format("delta").load(target.uri).count())
    return Written(rows=count, copy_bytes=int(copied.value), tasks=len(ranges))
