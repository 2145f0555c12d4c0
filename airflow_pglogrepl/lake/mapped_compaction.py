"""Compaction of tables under column mapping, which delta-rs 1.6 refuses to compact.

A mapped table's files hold physical names (``lake.mapping``), and delta-rs' ``OPTIMIZE``
refuses such a table ("Column mapping is not supported for write operation 'OPTIMIZE' yet").
Without compaction a changelog gains a file per window for ever, so the upkeep packs a mapped
table's small files itself: each file is read as Parquet (by physical name: the files of a
table turned to mapping in place hold their columns' own names, which became their physical
names), made the table's physical schema now (a column added since reads NULL, as Delta reads
it), and written again as a few bigger files; one commit then removes the small files and adds
the new ones, with ``dataChange = false`` (the same rows: no reader of the table's changes
sees a change, and the app transactions carry over).

Only files without a deletion vector are packed: delta-rs writes a ``remove`` without the
vector's descriptor, which does not match the ``add`` that carries one, so such a file would
stay live beside its packed copy and its rows be read twice. Those files are left for Spark
(``OPTIMIZE``), as the upkeep's advice says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake import delta, storage
from airflow_pglogrepl.lake.mapping import mapped_of, to_physical

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Packed:
    """What a compaction of a mapped table did: files removed and added, and the files it left
    because they carry deletion vectors."""

    removed: int
    added: int
    left_with_vectors: int


def compact(
    uri: str,
    table: Any,
    *,
    small_bytes: int,
    target_bytes: int,
    check_writer: Callable[[], None],
    commit_properties: Any = None,
    post_commithook_properties: Any = None,
) -> Packed:
    """Pack the files of the mapped table at ``uri`` (``table``, open) smaller than
    ``small_bytes`` and without deletion vectors into files of about ``target_bytes``, in one
    commit made after ``check_writer`` proved the lake's writer lock. Nothing is committed when
    fewer than two files would be packed together."""
    import pyarrow as pa
    from deltalake.transaction import AddAction, RemoveAction

    mapped = mapped_of(table)
    if mapped is None:
        raise ValueError(f"{uri} is not under column mapping: delta-rs compacts it itself")
    files = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
    with_vectors = _paths_with_vectors(table)
    small = [(str(p), int(s)) for p, s in zip(*(c.to_pylist() for c in files.columns),
                                               strict=True)
             if int(s) < small_bytes and not _has_vector(str(p), with_vectors)]  # fmt: skip
    bins = [group for group in _bins(small, target_bytes) if len(group) > 1]
    if not bins:
        return Packed(0, 0, len(with_vectors))
    logical = delta.unmapped(pa.schema(table.schema().to_arrow()))
    physical = to_physical(logical.empty_table(), mapped).schema
    system, base = storage.filesystem(uri)
    now = int(time.time() * 1000)
    actions: list[Any] = []
    for group in bins:
        rows = pa.concat_tables([_as(physical, _read(system, f"{base}/{p}")) for p, _ in group])
        written = delta.write_file(uri, rows, prefix="compacted")
        actions += [RemoveAction(p, False, now, size) for p, size in group]
        actions.append(AddAction(written.name, written.size, {}, now, False, written.stats()))
    check_writer()
    table.create_write_transaction(
        actions,
        mode="append",
        schema=table.schema(),
        commit_properties=commit_properties,
        post_commithook_properties=post_commithook_properties,
    )
    return Packed(sum(len(g) for g in bins), len(bins), len(with_vectors))


def _bins(files: list[tuple[str, int]], target: int) -> list[list[tuple[str, int]]]:
    """``files`` in order, cut into runs of at most ``target`` bytes (a run of one file may be
    bigger only if the file alone is)."""
    runs: list[list[tuple[str, int]]] = [[]]
    total = 0
    for path, size in files:
        if runs[-1] and total + size > target:
            runs.append([])
            total = 0
        runs[-1].append((path, size))
        total += size
    return [run for run in runs if run]


def _paths_with_vectors(table: Any) -> set[str]:
    import pyarrow as pa

    if "deletionVectors" not in (table.protocol().reader_features or []):
        return set()
    reader = pa.RecordBatchReader.from_stream(table.deletion_vectors())
    return {str(p) for batch in reader for p in batch.column("filepath").to_pylist()}


def _has_vector(path: str, with_vectors: set[str]) -> bool:
    """Whether the live file ``path`` (relative, as the log names it) has a deletion vector
    (``with_vectors`` holds full URIs)."""
    from urllib.parse import unquote

    return any(unquote(uri).endswith("/" + unquote(path)) for uri in with_vectors)


def _read(system: Any, path: str) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(path, filesystem=system)


def _as(schema: pa.Schema, rows: pa.Table) -> pa.Table:
    """``rows`` (a file's, by physical name) as ``schema``: a column or struct field the file
    lacks is NULL, every column of the table's type."""
    import pyarrow as pa

    columns = [
        _column_as(field, rows.column(field.name) if field.name in rows.column_names else None,
                   rows.num_rows)
        for field in schema
    ]  # fmt: skip
    return pa.Table.from_arrays(columns, schema=schema)


def _column_as(field: pa.Field, column: pa.ChunkedArray | None, count: int) -> pa.ChunkedArray:
    import pyarrow as pa

    if column is None:
        return pa.chunked_array([pa.nulls(count, field.type)], field.type)
    if pa.types.is_struct(field.type) and pa.types.is_struct(column.type):
        chunks = []
        for chunk in column.chunks:
            chunk = pa.concat_arrays([chunk]) if chunk.offset else chunk
            have = {chunk.type.field(i).name: i for i in range(chunk.type.num_fields)}
            children = [
                _column_as(child, pa.chunked_array([chunk.field(have[child.name])])
                           if child.name in have else None, len(chunk)).combine_chunks()
                for child in field.type
            ]  # fmt: skip
            mask = chunk.is_null() if chunk.null_count else None
            chunks.append(pa.StructArray.from_arrays(children, fields=list(field.type), mask=mask))
        return pa.chunked_array(chunks, field.type)
    return column.cast(field.type)
