"""The Delta log operations the drain needs without a JVM, through ``deltalake`` (delta-rs).

The changelog is appended from the driver's Arrow batches: pyarrow writes each batch as a
Parquet file inside the table's directory, where no reader looks until a log entry names it,
and one Delta commit per table and window then adds all of the window's files together with the
app transaction that makes a replay a no-op. Writing the files first and committing once keeps
memory bounded (a batch is written and dropped) while the window stays atomic for readers.

Local lakes are made durable before a commit returns, by ``lake.durability``, which says why
(and writes the log entries delta-rs cannot).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import COMMIT_LSN
from airflow_pglogrepl.lake import durability, opened_tables, row_groups
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lake.mapping import FEATURE, mapped_of, physical_names
from airflow_pglogrepl.lake.storage import delta_options, filesystem

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.mapping import MappedSchema


def open_table(uri: str, version: int | None = None) -> Any | None:
    """The ``deltalake.DeltaTable`` at ``uri`` (at ``version``; default its newest), or None
    when there is no Delta table there. Inside ``opened_tables.reused()`` the newest version is
    the table opened earlier in the run, brought up to date."""
    if version is None:
        return opened_tables.newest(uri, _load)
    return _load(uri, version)


def _load(uri: str, version: int | None = None) -> Any | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, version=version, storage_options=delta_options(uri))
    except TableNotFoundError:
        return None


def schema_of(table: Any) -> pa.Schema:
    """The Arrow schema of an open Delta table, as its log describes it."""
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def file_sizes(table: Any) -> list[int]:
    """The sizes in bytes of the live files of an open ``DeltaTable`` (its add actions): what a
    merge would rewrite, what compaction packs."""
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=False))
    return [int(size) for size in actions.column("size_bytes").to_pylist()]


def _version(uri: str) -> int | None:
    """The table's current version (None: no table at ``uri``)."""
    table = open_table(uri)
    return None if table is None else int(table.version())


def txn_version(uri: str, app: str) -> int | None:
    """The last transaction version ``app`` committed to the table at ``uri`` (None: none)."""
    table = open_table(uri)
    if table is None:
        return None
    version = table.transaction_version(app)
    return None if version is None else int(version)


def read_table(uri: str, version: int | None = None) -> pa.Table:
    """A Delta table's rows at its current (or a given) version, as a pyarrow Table, no JVM.

    Read through ``deltalake``'s scan (DataFusion), which applies deletion vectors; its
    ``to_pyarrow_table`` refuses tables that have them, as every state table does unless the
    lake was created without them (``Lake.state_config``). Not through ``QueryBuilder``, whose
    reads of an object store's files fail in deltalake 1.6 ("error sending request").
    """
    return scan(uri, version=version)


def scan(uri: str, *, version: int | None = None, columns: list[str] | None = None,
         where: str | None = None) -> pa.Table:  # fmt: skip
    """The rows of the table at ``uri`` (at ``version``) matching the DataFusion predicate
    ``where``, in the table's own column types (DataFusion gives strings as views, which few
    readers take)."""
    import pyarrow as pa
    from deltalake import DeltaTable

    if version is None:
        table = open_table(uri)
    else:
        table = opened_tables.at_version(uri, version, lambda u: _load(u, version))
    if table is None:  # (no table there: deltalake's own error says so)
        table = DeltaTable(uri, version=version, storage_options=delta_options(uri))
    rows = pa.table(table.scan(columns=columns, predicate=where))
    schema = pa.schema(table.schema().to_arrow())
    return rows.cast(pa.schema([schema.field(n) for n in rows.column_names]))


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


def arrow_schema(uri: str) -> pa.Schema | None:
    """The schema (with column metadata) of the Delta table at ``uri``; None: no table.

    Without column mapping's keys (ids, physical names): they are the table's, not the
    columns' (``lake.mapping.mapped_of`` reads them), and a schema compared or evolved must
    not carry them."""
    import pyarrow as pa

    table = open_table(uri)
    return None if table is None else unmapped(pa.schema(table.schema().to_arrow()))


def unmapped(schema: pa.Schema) -> pa.Schema:
    """``schema`` without column mapping's keys in any field's metadata, nested ones too."""
    import pyarrow as pa

    def strip(field: pa.Field) -> pa.Field:
        kind = field.type
        if pa.types.is_struct(kind):
            kind = pa.struct([strip(kind.field(i)) for i in range(kind.num_fields)])
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            value = strip(kind.value_field)
            kind = pa.large_list(value) if pa.types.is_large_list(kind) else pa.list_(value)
        meta = {k: v for k, v in (field.metadata or {}).items()
                if not k.startswith(b"delta.columnMapping.")}  # fmt: skip
        return pa.field(field.name, kind, field.nullable, metadata=meta or None)

    return pa.schema([strip(f) for f in schema], metadata=schema.metadata)


def evolve_schema(uri: str, schema: pa.Schema) -> None:
    """Add ``schema``'s columns the table lacks (nested ones too), as a metadata-only commit,
    and give its columns ``schema``'s column metadata.

    A commit that adds files cannot change the schema through delta-rs, so new columns get their
    own version first: a reader of that version sees them NULL in every existing row, which is
    what those rows hold until the changes that carry them commit.
    """
    import pyarrow as pa
    from deltalake import write_deltalake

    current = arrow_schema(uri)
    before = _version(uri)
    added = schema if current is None else _additions(current, schema)
    if current is None or not current.equals(added):
        write_deltalake(uri, added.empty_table(), mode="append", schema_mode="merge",
                        storage_options=delta_options(uri))  # fmt: skip
    table = open_table(uri)
    assert table is not None
    now = pa.schema(table.schema().to_arrow())
    for field in schema:  # column metadata the merge keeps as it was: one commit per column
        wanted = _text_metadata(field)
        if field.name in now.names and _text_metadata(now.field(field.name)) != wanted:
            table.alter.set_column_metadata(field.name, wanted)
    if is_local(uri):
        durability.make_log_durable(uri, after=before)


def _text_metadata(field: pa.Field) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}


def _additions(current: pa.Schema, wanted: pa.Schema) -> pa.Schema:
    """``current`` plus what ``wanted`` adds (top-level columns and struct fields), taking the
    fields ``current`` has as they are: delta-rs refuses to merge differing column metadata."""
    import pyarrow as pa

    def union(have: pa.Field, want: pa.Field) -> pa.Field:
        if not (pa.types.is_struct(have.type) and pa.types.is_struct(want.type)):
            return have
        children = {c.name: c for c in have.type}
        fields = [union(c, want.type.field(c.name)) if want.type.get_field_index(c.name) >= 0
                  else c for c in have.type]  # fmt: skip
        fields += [c for c in want.type if c.name not in children]
        return have.with_type(pa.struct(fields))

    names = set(current.names)
    fields = [union(f, wanted.field(f.name)) if f.name in wanted.names else f for f in current]
    return pa.schema(fields + [f for f in wanted if f.name not in names])


def list_tables(parent: str, known: Collection[str] = ()) -> list[str]:
    """Names of the directories under ``parent`` that hold a Delta table, sorted. A name in
    ``known`` (a table seen before: tables are never deleted) is taken without opening its log,
    which on an object store is a listing and a request per commit."""
    from pyarrow import fs

    system, base = filesystem(parent)
    try:
        infos = system.get_file_info(fs.FileSelector(base, allow_not_found=True))
    except FileNotFoundError:
        return []
    names = sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)
    return [n for n in names if n in known or open_table(f"{parent}/{n}") is not None]


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into a table's directory, not yet part of any version."""

    name: str
    size: int
    rows: int
    lsn_range: tuple[int, int] | None  # min and max of the commit LSN column, when it has one
    columns: tuple[str, ...] | None = None  # the file's top-level column names, when known
    # {stored column name: (min, max, null count)}, min and max None where not recorded
    column_stats: tuple[tuple[str, Any, Any, int], ...] = ()

    def stats(self) -> str:
        """The file's statistics: the commit LSN's (what the merge's range filter skips files
        by; its physical name is its own, under column mapping too), and ``column_stats``."""
        stats: dict[str, Any] = {"numRecords": self.rows}
        low_values = {n: low for n, low, _, _ in self.column_stats if low is not None}
        high_values = {n: high for n, _, high, _ in self.column_stats if high is not None}
        nulls = {n: count for n, _, _, count in self.column_stats}
        if self.lsn_range is not None:
            low, high = self.lsn_range
            low_values[COMMIT_LSN], high_values[COMMIT_LSN], nulls[COMMIT_LSN] = low, high, 0
        if nulls:
            stats.update(minValues=low_values, maxValues=high_values, nullCount=nulls)
        return json.dumps(stats)

    def add_action(self) -> Any:
        from deltalake.transaction import AddAction

        return AddAction(self.name, self.size, {}, int(time.time() * 1000), True, self.stats())


def write_file(uri: str, batch: pa.Table, prefix: str) -> DataFile:
    """Write ``batch`` as one Parquet file under the table directory ``uri`` (durably if local)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    system, base = filesystem(uri)
    system.create_dir(base, recursive=True)
    name = f"{prefix}-{uuid.uuid4().hex}.parquet"
    path = f"{base}/{name}"
    with pq.ParquetWriter(path, batch.schema, filesystem=system, compression="snappy") as out:
        row_groups.write_rows(out, batch)
    if is_local(uri):
        durability.fsync(path)
    lsn_range = None
    if COMMIT_LSN in batch.column_names and batch.num_rows:
        bounds = pc.min_max(batch.column(COMMIT_LSN))
        lsn_range = (int(bounds["min"].as_py()), int(bounds["max"].as_py()))
    return DataFile(
        name=name,
        size=int(system.get_file_info(path).size),
        rows=batch.num_rows,
        lsn_range=lsn_range,
        columns=tuple(batch.column_names),
    )


def commit_files(
    uri: str,
    schema: pa.Schema,
    files: Sequence[DataFile],
    *,
    app: str,
    version: int,
    expected: int | None,
    configuration: Mapping[str, str] | None = None,
    name: str | None = None,
    mapping: MappedSchema | None = None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """One Delta commit adding ``files`` with the app transaction ``(app, version)``, made only
    if the table's log holds ``expected`` for ``app`` (None: no table, or none of ``app``) and
    ``version`` is above it; else ``LakeCommitConflictError`` and nothing is committed.

    ``expected`` is the version the caller filtered its rows against: a compare-and-set, so a
    writer that lost its exclusivity cannot commit over another's work, and versions only go
    forward (delta-rs itself commits any version it is given, lower ones too). The check and
    the commit are one: the version is read from the snapshot the commit is made on, and
    delta-rs refuses to commit on top of a concurrent commit carrying the same app id. Creates
    the table (with ``configuration`` as its properties) when ``expected`` is None and none
    exists; a table created meanwhile by another writer makes the creation fail.

    Under column mapping (``lake.mapping``) the files hold physical names: a new table is
    created with ``mapping`` (by ``create_table``: delta-rs cannot), and an existing mapped
    table is appended to under its own schema.
    """
    from deltalake import CommitProperties, Schema, Transaction
    from deltalake.transaction import create_table_with_add_actions

    from airflow_pglogrepl.exceptions import LakeCommitConflictError

    commit = CommitProperties(app_transactions=[Transaction(app, version)],
                              custom_metadata=dict(metadata) if metadata else None)  # fmt: skip
    actions = [f.add_action() for f in files]
    table = open_table(uri)
    if table is None and mapping is not None:
        if expected is not None:
            raise LakeCommitConflictError(uri, app, expected, None, version)
        check_physical(uri, mapping, files)
        create_table(uri, schema, files, app=app, version=version,
                     configuration=dict(configuration or {}), mapping=mapping,
                     metadata=metadata)  # fmt: skip
        if is_local(uri):
            durability.make_log_durable(uri)
        return
    mapped = None if table is None else mapped_of(table)
    if mapping is not None and mapped is None:
        raise ValueError(
            f"{uri} exists without column mapping: files written under physical names would "
            f"read as NULL there. Nothing was committed"
        )
    if mapped is not None:
        check_physical(uri, mapped, files)
    delta_schema = (
        table.schema() if table is not None and mapped is not None else Schema.from_arrow(schema)
    )
    found = None if table is None else table.transaction_version(app)
    found = None if found is None else int(found)
    if found != expected or (found is not None and version <= found):
        raise LakeCommitConflictError(uri, app, expected, found, version)
    before = None if table is None else int(table.version())
    try:
        if table is None:
            create_table_with_add_actions(uri, delta_schema, actions, mode="error", name=name,
                                          configuration=dict(configuration or {}),
                                          storage_options=delta_options(uri),
                                          commit_properties=commit)  # fmt: skip
        else:
            table.create_write_transaction(actions, mode="append", schema=delta_schema,
                                           commit_properties=commit)  # fmt: skip
    except Exception as exc:  # delta-rs raises its own bare classes: a conflict is ours to name
        if not lost_race(exc):
            raise
        now = txn_version(uri, app)
        raise LakeCommitConflictError(uri, app, expected, now, version) from None
    if is_local(uri):
        durability.make_log_durable(uri, after=before)


def check_physical(uri: str, mapped: MappedSchema, files: Sequence[DataFile]) -> None:
    """Every file holds only the mapped table's physical names: a file written with logical
    names, or with another mapping, would read as NULL, without an error."""
    physical = set(physical_names(mapped))
    for file in files:
        if file.columns is None or not set(file.columns) <= physical:
            raise ValueError(
                f"{file.name} holds columns {list(file.columns or [])} that are not the "
                f"physical names of {uri}: written without the table's mapping "
                f"(lake.mapping.to_physical with mapped_of). Nothing was committed"
            )


def lost_race(exc: Exception) -> bool:
    """Whether a delta-rs commit failed because another writer committed first (a concurrent
    transaction of the same app, or a table created in between)."""
    text = str(exc)
    return any(
        sign in text
        for sign in ("Concurrent transaction", "already exists", "Metadata changed since")
    )


# Set on every table the lake creates: no writer (Spark, delta-rs) deletes log entries when it
# checkpoints. Log cleanup is the upkeep's alone (``lake.upkeep``), which first checks that the
# positions it was asked to keep stay readable; an explicit cleanup still works.
KEEP_LOGS = {"delta.enableExpiredLogCleanup": "false"}
# A state table's by default: deletion vectors on, so merges by Spark mark rows instead of
# rewriting files. A lake created with ``state_deletion_vectors=False`` turns them off for its new
# state tables (``Lake.state_config``), for readers that cannot apply them.
# The ``userMetadata`` of a commit that replaced a state whole from a copy of the source (a
# re-snapshot, a backfill's build), not from the changelog: what a history must begin again at.
REWRITTEN = "pglogrepl:state-rewritten"
STATE_CONFIG = {**KEEP_LOGS, "delta.enableDeletionVectors": "true"}


def create_table(
    uri: str,
    schema: pa.Schema,
    files: Sequence[DataFile],
    *,
    app: str,
    version: int,
    configuration: Mapping[str, str],
    mapping: MappedSchema | None = None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Create the table at ``uri`` as version 0 holding ``files``, with the app transaction
    ``(app, version)``, put only if no table is there (``LakeCommitConflictError`` otherwise).

    Why not ``deltalake``'s own creation: with deletion vectors enabled it adds reader features
    no column needs (``variantType``), which readers that do not know them refuse. The protocol
    here is the least that the table needs: ``deletionVectors`` when enabled, ``timestampNtz``
    when a column holds a timestamp without a time zone, ``columnMapping`` with ``mapping``
    (``lake.mapping``: ``schema``'s fields with ids and physical names; ``files`` then hold the
    physical names), which delta-rs cannot create a table with."""
    from deltalake import Schema

    from airflow_pglogrepl.exceptions import LakeCommitConflictError

    features = []
    if configuration.get("delta.enableDeletionVectors") == "true":
        features.append("deletionVectors")
    if _has_timestamp_ntz(schema):
        features.append("timestampNtz")
    config = dict(configuration)
    if mapping is not None:
        features.append(FEATURE)
        config.update(mapping.configuration())
    now = int(time.time() * 1000)
    protocol: dict[str, Any] = {"minReaderVersion": 1, "minWriterVersion": 2}
    if features:
        # The writer features of the legacy protocol (1, 2) stay, as Spark keeps them when a
        # feature lifts a table to (3, 7), unless the table asks for (3, 7) itself (column
        # mapping does): the same table, whichever wrote it.
        legacy = ["invariants", "appendOnly"] if mapping is None else []
        protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features,
                    "writerFeatures": [*features, *legacy]}  # fmt: skip
    schema_string = mapping.to_json() if mapping else Schema.from_arrow(schema).to_json()
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "txnId": str(uuid.uuid4()), "operation": "CREATE TABLE",
                        "operationParameters": {}, "engineInfo": "airflow-pglogrepl",
                        **(metadata or {})}},
        {"protocol": protocol},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema_string, "partitionColumns": [],
                      "configuration": config, "createdTime": now}},
        {"txn": {"appId": app, "version": version, "lastUpdated": now}},
        *add_entries(files, now),
    ]  # fmt: skip
    text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    if not durability.put_first_commit(uri, text.encode()):
        raise LakeCommitConflictError(uri, app, None, txn_version(uri, app), version, log_version=0)


def add_entries(files: Sequence[DataFile], now: int) -> list[dict[str, Any]]:
    """The log's ``add`` actions of ``files`` (for a commit written by the lake itself)."""
    return [{"add": {"path": f.name, "partitionValues": {}, "size": f.size,
                     "modificationTime": now, "dataChange": True, "stats": f.stats()}}
            for f in files]  # fmt: skip


def _has_timestamp_ntz(schema: Any) -> bool:
    import pyarrow as pa

    def naive(kind: pa.DataType) -> bool:
        if pa.types.is_timestamp(kind):
            return kind.tz is None
        if pa.types.is_struct(kind):
            return any(naive(kind.field(i).type) for i in range(kind.num_fields))
        if pa.types.is_map(kind):
            return naive(kind.key_type) or naive(kind.item_type)
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return naive(kind.value_type)
        return False

    return any(naive(field.type) for field in schema)
