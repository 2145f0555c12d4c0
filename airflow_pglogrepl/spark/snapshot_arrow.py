"""One table's snapshot copy made by the application's own process, without Spark.

Why: Spark's start (its JVM, then a Python worker for the tasks) takes longer than the whole copy
of a small database. A table of up to ``ARROW_MAX_BYTES`` of heap is copied here instead, by the
means a Spark task uses: the same block ranges (``range_copy.plan_ranges``), the same reader and
conversion (``range_copy.CopyTask.copy``: one mapping of values for a snapshot and a drain), on
threads of this process. Each range's batches are streamed into Parquet files in the copy's
target, a batch at a time (memory: per range, about a batch read and one written), and the files
become one Delta version (``delta.create_table``) with what Spark's copy of the table would get:
its properties, column mapping when a name needs it, the app transaction.

Where the copy goes and how it becomes visible is the snapshot's, whichever way copied it
(``spark.snapshot``): staged for an initial snapshot, then published whole.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from airflow_pglogrepl.faults import pause
from airflow_pglogrepl.lake import delta, durability
from airflow_pglogrepl.lake.delta import DataFile
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lake.mapping import (
    MODE,
    PROTOCOL_KEYS,
    MappedSchema,
    mapped_schema,
    to_physical,
)
from airflow_pglogrepl.lake.storage import filesystem
from airflow_pglogrepl.spark.file_stats import ColumnStats
from airflow_pglogrepl.spark.range_copy import BlockRange, CopyTask, plan_ranges
from airflow_pglogrepl.spark.snapshot_target import CopyTarget, Written

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.postgres.snapshot import SnapshotTable

__all__ = ["FILE_BYTES", "CopyStoppedError", "Readers", "copy_in_process", "usable_cpus",
           "write_files"]  # fmt: skip

# A file is closed, and the next begun, once this many Arrow bytes were written into it.
FILE_BYTES = 256 << 20


class Readers:
    """What every table copied in process shares: how many ranges may be read at once (one
    session and about three batches each), and whether one has failed (the others then stop at
    their next batch instead of copying on for a snapshot that cannot commit)."""

    def __init__(self, at_once: int) -> None:
        self.slots = threading.BoundedSemaphore(max(1, at_once))
        self.failed = threading.Event()


class CopyStoppedError(Exception):
    """A range stopped because another range of the snapshot failed."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def copy_in_process(table: SnapshotTable, target: CopyTarget, *, task: CopyTask,
                    max_tasks: int, rows_per_task: int, readers: Readers) -> Written:  # fmt: skip
    """Copy ``table`` into ``target`` as a new table's version 0: at most ``max_tasks`` ranges
    of about ``rows_per_task`` rows, read side by side on threads (as many at once, over every
    table, as ``readers`` allows). Only a new table: a re-snapshot into a table that exists is
    Spark's (``target.resnapshot``)."""
    if target.resnapshot:
        raise ValueError(f"{table.table}: a re-snapshot is copied on Spark")
    ranges = plan_ranges(table, max_tasks=max_tasks, rows_per_task=rows_per_task)
    config = {k: v for k, v in target.configuration.items() if k not in PROTOCOL_KEYS}
    mapped = mapped_schema(target.schema) if MODE in config else None  # (``target.mapped``)
    workers = max(1, min(max_tasks, len(ranges)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="snapshot-range") as pool:
        done = list(pool.map(lambda r: _copy_range(task, r, target, mapped, readers), ranges))
    files = [f for copied, _ in done for f in copied]
    delta.create_table(target.uri, target.schema, files, app=target.app, version=target.version,
                       configuration=config, mapping=mapped)  # fmt: skip
    return Written(rows=sum(f.rows for f in files), copy_bytes=sum(n for _, n in done),
                   tasks=len(ranges))  # fmt: skip


def _copy_range(
    task: CopyTask,
    block_range: BlockRange,
    target: CopyTarget,
    mapped: MappedSchema | None,
    readers: Readers,
) -> tuple[list[DataFile], int]:
    with readers.slots:
        if block_range.start > 0:
            pause("before_later_range")
        try:
            counted = _Counted(task.copy(block_range), readers.failed)
            files = write_files(target.uri, counted, target.schema, mapped=mapped)
        except CopyStoppedError:
            raise
        except BaseException:
            readers.failed.set()
            raise
    return files, counted.total


class _Counted:
    """The batches a range's copy yields, counted as they pass (Arrow bytes, as fetched)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], failed: threading.Event) -> None:
        self._batches = batches
        self._failed = failed
        self.total = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            if self._failed.is_set():
                raise CopyStoppedError("another range of the snapshot failed")
            self.total += batch.nbytes
            yield batch


def write_files(
    target: str,
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    *,
    mapped: MappedSchema | None,
    file_bytes: int = FILE_BYTES,
) -> list[DataFile]:
    """Stream ``batches`` into Parquet files under ``target``: one row group per batch, the
    next file begun once ``file_bytes`` were written into one; each file durable when local."""
    files: list[DataFile] = []
    current: _File | None = None
    try:
        for batch in batches:
            if current is None:
                current = _File(target, _stored_schema(schema, mapped))
            current.write(batch, schema, mapped)
            if current.written >= file_bytes:
                files.append(current.close())
                current = None
    except BaseException:
        if current is not None:  # closed now, before the caller removes what was staged
            with contextlib.suppress(Exception):
                current.writer.close()
        raise
    if current is not None:
        files.append(current.close())
    return files


def _stored_schema(schema: pa.Schema, mapped: MappedSchema | None) -> pa.Schema:
    return schema if mapped is None else to_physical(schema.empty_table(), mapped).schema


class _File:
    """One Parquet file being written, a batch at a time."""

    def __init__(self, target: str, stored: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self.system, base = filesystem(target)
        self.system.create_dir(base, recursive=True)
        self.name = f"part-{uuid.uuid4().hex}.parquet"
        self.path = f"{base}/{self.name}"
        self.local = is_local(target)
        self.stored = stored
        self.writer = pq.ParquetWriter(self.path, stored, filesystem=self.system,
                                       compression="snappy")  # fmt: skip
        self.written = 0
        self.rows = 0
        self.stats = ColumnStats(stored)

    def write(self, batch: pa.RecordBatch, schema: pa.Schema, mapped: MappedSchema | None) -> None:
        import pyarrow as pa

        table = pa.Table.from_arrays(batch.columns, schema=schema)  # the lake's names
        stored = table if mapped is None else to_physical(table, mapped)
        self.writer.write_table(stored)
        self.stats.add(stored)
        self.written += batch.nbytes
        self.rows += batch.num_rows

    def close(self) -> DataFile:
        self.writer.close()
        if self.local:
            durability.fsync(self.path)
        size = int(self.system.get_file_info(self.path).size)
        return DataFile(name=self.name, size=size, rows=self.rows, lsn_range=None,
                        columns=tuple(self.stored.names),
                        column_stats=self.stats.recorded())  # fmt: skip
