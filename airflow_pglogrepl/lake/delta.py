"""The Delta log operations the drain needs without a JVM, through ``deltalake`` (delta-rs).

The changelog is appended from the driver's Arrow batches: pyarrow writes each batch as a
Parquet file inside the table's directory, where no reader looks until a log entry names it,
and one Delta commit per table and window then adds all of the window's files together with the
app transaction that makes a replay a no-op. Writing the files first and committing once keeps
memory bounded (a batch is written and dropped) while the window stays atomic for readers.

Local lakes are made durable before a commit returns: delta-rs does not fsync, and the slot may
be advanced as soon as the commit is known, so the data files, the log entry and their
directories are fsynced here (a power cut must not take back what the slot forgot).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake.changelog import COMMIT_LSN
from airflow_pglogrepl.lake.layout import is_local

if TYPE_CHECKING:
    import pyarrow as pa


def open_table(uri: str) -> Any | None:
    """The ``deltalake.DeltaTable`` at ``uri``, or None when there is no Delta table there."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri)
    except TableNotFoundError:
        return None


def txn_version(uri: str, app: str) -> int | None:
    """The last transaction version ``app`` committed to the table at ``uri`` (None: none)."""
    table = open_table(uri)
    if table is None:
        return None
    version = table.transaction_version(app)
    return None if version is None else int(version)


def read_table(uri: str, version: int | None = None) -> pa.Table:
    """A Delta table's rows at its current (or a given) version, as a pyarrow Table, no JVM.

    Read through ``deltalake``'s query engine (DataFusion), which applies deletion vectors; its
    ``to_pyarrow_table`` refuses tables that have them, and every state table does.
    """
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(uri, version=version)
    return pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t"))


def column_types(schema: Any) -> list[tuple[str, str]]:
    """``(name, Delta type)`` of each top-level column of an Arrow or Delta schema."""
    from deltalake import Schema

    delta_schema = schema if isinstance(schema, Schema) else Schema.from_arrow(schema)
    fields = json.loads(delta_schema.to_json())["fields"]
    return [(f["name"], json.dumps(f["type"], sort_keys=True)) for f in fields]


def unsupported_columns(schema: pa.Schema) -> dict[str, str]:
    """Columns of ``schema`` Delta Lake has no type for, with their Arrow types (none: {})."""
    import pyarrow as pa
    from deltalake import Schema

    try:
        Schema.from_arrow(schema)
        return {}
    except Exception:  # delta-rs raises a bare Exception: find the columns it refuses
        pass
    refused = {}
    for field in schema:
        try:
            Schema.from_arrow(pa.schema([field]))
        except Exception:
            refused[field.name] = str(field.type)
    return refused


def schema_difference(uri: str, schema: pa.Schema) -> str | None:
    """How ``schema`` differs from the columns of the table at ``uri`` (None: the same, or no
    table yet)."""
    table = open_table(uri)
    if table is None:
        return None
    have, want = column_types(table.schema()), column_types(schema)
    if have == want:
        return None
    old, new = dict(have), dict(want)
    parts = []
    if added := [n for n in new if n not in old]:
        parts.append(f"added {added}")
    if dropped := [n for n in old if n not in new]:
        parts.append(f"dropped {dropped}")
    if changed := [n for n in new if n in old and new[n] != old[n]]:
        parts.append(f"changed type of {changed}")
    return ", ".join(parts) or "reordered columns"


def list_tables(parent: str) -> list[str]:
    """Names of the directories under ``parent`` that hold a Delta table, sorted."""
    from pyarrow import fs

    filesystem, base = _filesystem(parent)
    try:
        infos = filesystem.get_file_info(fs.FileSelector(base, allow_not_found=True))
    except FileNotFoundError:
        return []
    names = sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)
    return [n for n in names if open_table(f"{parent}/{n}") is not None]


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into a table's directory, not yet part of any version."""

    name: str
    size: int
    rows: int
    lsn_range: tuple[int, int] | None  # min and max of the commit LSN column, when it has one

    def add_action(self) -> Any:
        from deltalake.transaction import AddAction

        # Statistics for the commit LSN only: what the merge's range filter skips files by.
        stats: dict[str, Any] = {"numRecords": self.rows}
        if self.lsn_range is not None:
            low, high = self.lsn_range
            stats.update(
                minValues={COMMIT_LSN: low}, maxValues={COMMIT_LSN: high}, nullCount={COMMIT_LSN: 0}
            )
        return AddAction(self.name, self.size, {}, int(time.time() * 1000), True, json.dumps(stats))


def write_file(uri: str, batch: pa.Table, prefix: str) -> DataFile:
    """Write ``batch`` as one Parquet file under the table directory ``uri`` (durably if local)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    filesystem, base = _filesystem(uri)
    filesystem.create_dir(base, recursive=True)
    name = f"{prefix}-{uuid.uuid4().hex}.parquet"
    path = f"{base}/{name}"
    pq.write_table(batch, path, filesystem=filesystem, compression="snappy")
    if is_local(uri):
        _fsync(path)
    lsn_range = None
    if COMMIT_LSN in batch.column_names and batch.num_rows:
        bounds = pc.min_max(batch.column(COMMIT_LSN))
        lsn_range = (int(bounds["min"].as_py()), int(bounds["max"].as_py()))
    return DataFile(
        name=name,
        size=int(filesystem.get_file_info(path).size),
        rows=batch.num_rows,
        lsn_range=lsn_range,
    )


def commit_files(
    uri: str,
    schema: pa.Schema,
    files: Sequence[DataFile],
    *,
    app: str,
    version: int,
    configuration: Mapping[str, str] | None = None,
    name: str | None = None,
) -> None:
    """One Delta commit adding ``files`` with the app transaction ``(app, version)``.

    Creates the table (with ``configuration`` as its properties) when none exists yet. A
    ``version`` at or below the one already recorded for ``app`` is a caller error: the lake
    filters replayed rows before writing them, so that never reaches here.
    """
    from deltalake import CommitProperties, Schema, Transaction
    from deltalake.transaction import create_table_with_add_actions

    commit = CommitProperties(app_transactions=[Transaction(app, version)])
    actions = [f.add_action() for f in files]
    delta_schema = Schema.from_arrow(schema)
    table = open_table(uri)
    if table is None:
        create_table_with_add_actions(
            uri,
            delta_schema,
            actions,
            mode="append",
            name=name,
            configuration=dict(configuration or {}),
            commit_properties=commit,
        )
    else:
        table.create_write_transaction(actions, mode="append", schema=delta_schema,
                                       commit_properties=commit)  # fmt: skip
    if is_local(uri):
        make_log_durable(uri)


def make_log_durable(uri: str) -> None:
    """fsync a local table's directory, its log directory and its newest log entries."""
    log_dir = os.path.join(uri, "_delta_log")
    entries = sorted(n for n in os.listdir(log_dir) if n.endswith(".json"))
    for name in entries[-2:]:
        _fsync(os.path.join(log_dir, name))
    _fsync(log_dir)
    _fsync(uri)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _filesystem(uri: str) -> tuple[Any, str]:
    from pyarrow import fs

    if is_local(uri):
        return fs.LocalFileSystem(), os.path.abspath(uri)
    filesystem, path = fs.FileSystem.from_uri(uri)
    return filesystem, path
