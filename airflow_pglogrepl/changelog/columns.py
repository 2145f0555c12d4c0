"""The changelog's columns: the contract between the drain, the state merge and readers.

Every ``changes/<schema>.<table>`` Delta table holds the table's own columns (typed, nullable)
plus:

========== ============== ======================================================================
column     type           meaning
========== ============== ======================================================================
_op        string         ``I`` insert, ``U`` update, ``D`` delete, ``T`` truncate
_commit_lsn int64         commit LSN of the transaction (order of transactions)
_seq       int64          order of the change inside its transaction, across all tables;
                          ``(_commit_lsn, _seq)`` is unique in the whole lake
_xid       int64          transaction id
_commit_ts timestamp(UTC) commit time
_unchanged array<string>  columns whose value is an unchanged TOASTed value: the column holds
                          NULL here but the row's value did not change (never a real NULL)
_old       struct         for ``U`` only, when PostgreSQL sent the old key (the key changed) or
                          the whole old row (REPLICA IDENTITY FULL): a struct with the table's
                          columns and types (only key fields set for an old key), else NULL
========== ============== ======================================================================

``D`` rows carry the old key (or the whole old row under REPLICA IDENTITY FULL) in the table's
columns; other columns are NULL. ``T`` rows have every table column NULL.

The schema describes the table too, in column metadata that Delta keeps: each replica identity
key column has ``pglogrepl.key`` (its position in the key), and ``_op`` has
``pglogrepl.replica_identity`` (``d`` default, ``i`` index, ``f`` full, ``n`` nothing). The merge
reads the key from there, so the table needs no side record to be merged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.pgoutput.table_info import TableInfo

OP = "_op"
COMMIT_LSN = "_commit_lsn"
SEQ = "_seq"
XID = "_xid"
COMMIT_TS = "_commit_ts"
UNCHANGED = "_unchanged"
OLD = "_old"

META_COLUMNS = (OP, COMMIT_LSN, SEQ, XID, COMMIT_TS, UNCHANGED, OLD)

INSERT, UPDATE, DELETE, TRUNCATE = "I", "U", "D", "T"

KEY_META = "pglogrepl.key"
IDENTITY_META = "pglogrepl.replica_identity"


def changelog_schema(table: TableInfo) -> pa.Schema:
    """The changelog's schema for a table description: its columns (typed by the decoder's
    mapping, the key marked), then the metadata columns.

    Every field is nullable, the metadata columns too: Delta on Spark reads a NOT NULL column
    as an invariant, a table feature the protocol delta-rs writes does not list, and would
    refuse the table.
    """
    import pyarrow as pa

    from airflow_pglogrepl.changelog.types import arrow_schema

    base = arrow_schema(table)
    return pa.schema(
        [*mark_keys(base, table.key_names), *meta_fields(base, table.replica_identity)]
    )


def old_type(schema: pa.Schema) -> pa.DataType:
    """The type of a changelog schema's ``_old``, its last column: taken by place, as a column
    of the table may be called ``_old`` too."""
    field = schema.field(len(schema) - 1)
    assert field.name == OLD, schema
    return field.type


def mark_keys(fields: pa.Schema | Sequence[pa.Field], key: Sequence[str]) -> list[pa.Field]:
    """``fields`` with each key column marked by its position in ``key``."""
    position = {name: index for index, name in enumerate(key)}
    return [
        f.with_metadata({**(f.metadata or {}), KEY_META.encode(): str(position[f.name]).encode()})
        if f.name in position
        else f
        for f in fields
    ]


def meta_fields(base: Sequence[pa.Field], replica_identity: str | None = None) -> list[pa.Field]:
    """The metadata columns of a changelog whose table columns are ``base``, in order (what
    follows the table's own columns in every ``changes/`` table)."""
    import pyarrow as pa

    return [
        pa.field(OP, pa.string()).with_metadata(identity_metadata(replica_identity)),
        pa.field(COMMIT_LSN, pa.int64()),
        pa.field(SEQ, pa.int64()),
        pa.field(XID, pa.int64()),
        pa.field(COMMIT_TS, pa.timestamp("us", tz="UTC")),
        pa.field(UNCHANGED, pa.list_(pa.string())),
        pa.field(OLD, pa.struct([pa.field(f.name, f.type) for f in base])),
    ]


def identity_metadata(replica_identity: str | None) -> dict[str, str]:
    return {IDENTITY_META: replica_identity or "d"}


def described_key(fields: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[str]:
    """The key columns, in key order, from ``(name, metadata)`` pairs of a changelog schema."""
    marked = [(int(meta[KEY_META]), name) for name, meta in fields if meta and KEY_META in meta]
    return [name for _, name in sorted(marked)]


def described_identity(fields: Sequence[tuple[str, Mapping[str, Any] | None]]) -> str:
    for name, meta in fields:
        if name == OP and meta and IDENTITY_META in meta:
            return str(meta[IDENTITY_META])
    return "d"
