"""The commits that change a Delta table's schema: columns added or renamed, column mapping turned
on, a table replaced by an empty one of a new schema, an append under a new mapped schema.

delta-rs changes the schema of a table without column mapping itself; under mapping it can
neither change the schema nor turn mapping on, so the lake writes those log entries whole: the
table's metadata with the new schema (``lake.mapping`` builds it), put as the next version only
if no other writer took it (``durability.put_commit``: a create-only write, locally and on an
object store). A lost race is ``LakeCommitConflictError``: nothing of the commit was made.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake import delta, durability, storage
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lake.mapping import (
    MappedSchema,
    mapped_of,
    mapped_schema,
    needed,
    renamed,
    with_mapping_feature,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.delta import DataFile

__all__ = ["commit_schema", "commit_with_schema", "rename_columns", "reset_table",
           "spell_out_mapping"]  # fmt: skip


def reset_table(uri: str, schema: pa.Schema, *, app: str, version: int) -> int | None:
    """Replace the table at ``uri`` by an empty one of ``schema``, as one version carrying
    ``(app, version)``; returns the version written by the lake itself (None: by delta-rs).

    Earlier versions stay readable (time travel) until ``VACUUM``. Refused
    (``LakeCommitConflictError``) when the table already holds ``app`` at ``version`` or beyond:
    emptying it there would forget changes the caller never saw. A table under column mapping,
    or a schema that needs it, is replaced under mapping (fresh ids and physical names, which
    delta-rs cannot write); any other through delta-rs's overwrite.
    """
    table = delta.open_table(uri)
    if (table is not None and mapped_of(table) is not None) or needed(schema):
        if table is None:
            raise ValueError(f"{uri} is not a table")
        return _reset_mapped(uri, table, schema, app=app, version=version)
    from deltalake import CommitProperties, Transaction, write_deltalake

    commit = CommitProperties(app_transactions=[Transaction(app, version)])
    before = None if table is None else int(table.version())
    found = None if table is None else table.transaction_version(app)
    if found is not None and int(found) >= version:  # it would forget changes past ``version``
        raise LakeCommitConflictError(uri, app, int(found), int(found), version)
    options = storage.delta_options(uri)
    write_deltalake(uri, schema.empty_table(), mode="overwrite", schema_mode="overwrite",
                    commit_properties=commit, storage_options=options)  # fmt: skip
    if is_local(uri):
        durability.make_log_durable(uri, after=before)
    return None


def rename_columns(uri: str, renames: dict[str, str]) -> int:
    """Rename columns of the mapped table at ``uri`` (``old -> new`` logical names, top level,
    and the same names among the children of ``_old``) in one metadata-only commit; returns
    its version. The files and their physical names do not change: readers see the old values
    under the new names.

    Refused before anything is written: a name the table lacks, and a result Delta could not
    open, two names of one struct equal without case, or a name of the changelog's own."""
    table = delta.open_table(uri)
    mapped = None if table is None else mapped_of(table)
    if table is None or mapped is None:
        raise ValueError(f"{uri} is not a table under column mapping")
    return _put_metadata(uri, table, renamed(mapped, renames, where=uri), "RENAME COLUMN",
                         {"renames": json.dumps(renames)})  # fmt: skip


def commit_schema(uri: str, mapped: MappedSchema) -> int | None:
    """Give the table at ``uri`` the schema ``mapped`` in one metadata-only commit (its
    columns added, their metadata), turning column mapping on if the table has none yet (an
    upgrade in place: ``mapped`` then names each existing column by its own name, the files'
    name); returns the version, None when the table already has that schema.

    delta-rs cannot change a mapped table's schema, nor turn mapping on, so the commit is put
    as Delta's log entry of the next version, only if no other writer took that version
    (``LakeError`` otherwise: nothing was changed). The protocol of an upgraded table keeps
    its features and gains ``columnMapping`` (reader 3 / writer 7: see the module docstring)."""
    table = delta.open_table(uri)
    if table is None:
        raise ValueError(f"{uri} is not a table")
    current = mapped_of(table)
    if current is not None and current.schema == mapped.schema:
        return None
    protocol = None if current is not None else _with_mapping(table.protocol())
    operation = "ADD COLUMNS" if current is not None else "UPGRADE TO COLUMN MAPPING"
    return _put_metadata(uri, table, mapped, operation, {}, protocol=protocol)


def commit_with_schema(uri: str, mapped: MappedSchema, files: Sequence[DataFile], *, app: str,
                       version: int, expected: int | None) -> None:  # fmt: skip
    """One commit giving the table at ``uri`` the schema ``mapped`` (columns added or renamed,
    column mapping turned on) and adding ``files`` with the app transaction ``(app,
    version)``, only if the table's log holds ``expected`` for ``app``
    (``LakeCommitConflictError`` otherwise, as ``delta.commit_files``).

    One commit, not a schema version then the files': a rename committed without the rows
    written before it would leave a run that died in between to meet those rows' old name as a
    column of its own."""
    table = delta.open_table(uri)
    if table is None:
        raise ValueError(f"{uri} is not a table")
    found = table.transaction_version(app)
    found = None if found is None else int(found)
    if found != expected or (found is not None and version <= found):
        raise LakeCommitConflictError(uri, app, expected, found, version)
    delta.check_physical(uri, mapped, files)
    protocol = None if mapped_of(table) is not None else _with_mapping(table.protocol())
    now = int(time.time() * 1000)
    txn = {"txn": {"appId": app, "version": version, "lastUpdated": now}}
    _put_metadata(uri, table, mapped, "WRITE", {"mode": "Append"}, protocol=protocol,
                  extra=[txn, *delta.add_entries(files, now)])  # fmt: skip


def spell_out_mapping(uri: str, table: Any = None) -> int | None:
    """Name column mapping among the reader features of the table at ``uri`` when its protocol
    only implies it (reader version 2: what Spark creates a mapped table without another reader
    feature as, and what ``deltalake``'s pyarrow readers read as NULLs; ``mapping.spelled_out``),
    in a protocol-only commit; returns its version, None when nothing needed it. Called on an
    empty table Spark just created, before any row is in it, and on a table before it is
    written to (``table``: opened already)."""
    import json

    table = table if table is not None else delta.open_table(uri)
    if table is None:
        raise ValueError(f"{uri} is not a table")
    current = table.protocol()
    if current.min_reader_version != 2:
        return None
    protocol = _with_mapping(current)
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "txnId": str(uuid.uuid4()),
                        "operation": "UPGRADE PROTOCOL", "operationParameters": {},
                        "engineInfo": "airflow-pglogrepl"}},
        {"protocol": protocol},
    ]  # fmt: skip
    data = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()
    version = int(table.version()) + 1
    if not durability.put_commit(uri, version, data):
        raise LakeCommitConflictError(uri, "UPGRADE PROTOCOL", None, None, version,
                                      log_version=version)  # fmt: skip
    return version


def _with_mapping(protocol: Any) -> dict[str, Any]:
    """A table's protocol (``deltalake``'s) with the ``columnMapping`` feature."""
    return with_mapping_feature(protocol.min_reader_version, protocol.min_writer_version,
                                protocol.reader_features, protocol.writer_features)  # fmt: skip


def _put_metadata(uri: str, table: Any, mapped: MappedSchema, operation: str,
                  parameters: dict[str, str], *, protocol: dict[str, Any] | None = None,
                  extra: list[dict[str, Any]] | None = None) -> int:  # fmt: skip
    """Put ``table``'s next log entry: ``mapped`` as its schema, the rest of its metadata (id,
    configuration, partitioning, creation time) kept, ``protocol`` when given, and ``extra``
    actions."""
    meta = table.metadata()
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "txnId": str(uuid.uuid4()), "operation": operation,
                        "operationParameters": parameters, "engineInfo": "airflow-pglogrepl"}},
        *([{"protocol": protocol}] if protocol is not None else []),
        {"metaData": {"id": meta.id, "name": meta.name, "description": meta.description,
                      "format": {"provider": "parquet", "options": {}},
                      "schemaString": mapped.to_json(),
                      "partitionColumns": list(meta.partition_columns),
                      "configuration": {**dict(meta.configuration), **mapped.configuration()},
                      "createdTime": meta.created_time}},
        *(extra or []),
    ]  # fmt: skip
    data = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()
    version = int(table.version()) + 1
    if not durability.put_commit(uri, version, data):
        raise LakeCommitConflictError(uri, operation, None, None, version, log_version=version)
    return version


def _reset_mapped(uri: str, table: Any, schema: pa.Schema, *, app: str, version: int) -> int:
    """``reset_table`` under column mapping (fresh ids and physical names): every live file
    removed, the new schema, the app transaction, in one entry. Only for tables without
    deletion vectors (changelogs): a remove written here names no vector."""
    import pyarrow as pa

    found = table.transaction_version(app)
    if found is not None and int(found) >= version:
        raise LakeCommitConflictError(uri, app, int(found), int(found), version)
    now = int(time.time() * 1000)
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    removes = [{"remove": {"path": p, "deletionTimestamp": now, "dataChange": True}}
               for p in paths]  # fmt: skip
    txn = {"txn": {"appId": app, "version": version, "lastUpdated": now}}
    protocol = None if mapped_of(table) is not None else _with_mapping(table.protocol())
    old = mapped_of(table)  # ids never given again: above every one the table had
    fresh = mapped_schema(
        schema,
        previous=MappedSchema({"type": "struct", "fields": []}, 0 if old is None else old.max_id),
    )
    return _put_metadata(uri, table, fresh, "REPLACE TABLE", {},
                         protocol=protocol, extra=[*removes, txn])  # fmt: skip
