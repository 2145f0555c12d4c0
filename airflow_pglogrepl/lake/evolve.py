"""How a table's lake schema follows the source table, from what pgoutput's Relation messages say.

pgoutput describes a table again (a Relation message) before the first change that uses a new
column list, so every changelog batch carries the columns its rows had. The lake keeps, per
table, the *union* of every column it has seen, in the order it saw them:

* **a column the lake has not seen** is added at the end of ``changes/<table>`` (one metadata-only
  Delta commit, no file rewritten) and of ``state/<table>`` at the next merge. Rows from before it
  hold what PostgreSQL says they hold: ``ADD COLUMN ... DEFAULT <constant>`` leaves the existing
  rows without a value on disk and makes them read the column's *missing value*, which the drain
  asks the catalog for (``ColumnOrigin``) and records in the column's metadata
  (``pglogrepl.fill``, with ``pglogrepl.added``: the first change that carried the column). Rows
  before that point read the fill, in ``state/`` and in the merge. A column whose existing rows
  hold values no change and no catalog entry reveals (a volatile default such as
  ``clock_timestamp()``, after which PostgreSQL rewrote the table) stops the drain, naming the fix:
  re-snapshot the table;
* **a column the source no longer sends** (``DROP COLUMN``) stays in the lake; rows written after
  the drop hold NULL there;
* **a type change that keeps the lake type** needs nothing: every integer type is ``int64``,
  every ``numeric(p, s)`` is ``decimal(38, s)`` and ``varchar(n)`` and ``text`` are both
  ``string`` (``changelog.types``), so ``int -> bigint``, ``numeric`` precision up and
  ``varchar(n) -> text`` keep the lake's files as they are;
* **anything else** (another lake type, another key, another replica identity) cannot be applied
  to rows already written: ``IncompatibleSchemaChangeError``, before anything is written. The
  fix, a re-snapshot of the table, starts its changelog again with the new columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    KEY_META,
    META_COLUMNS,
    OLD,
    OP,
    SEQ,
    described_identity,
    described_key,
)
from airflow_pglogrepl.changelog.types import TYPE_META, arrow_value, column_type
from airflow_pglogrepl.exceptions import ColumnBackfillError, IncompatibleSchemaChangeError
from airflow_pglogrepl.lake.column_names import FORMER_META, SOURCE_META

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.models.records import ColumnOrigins

ADDED_META = "pglogrepl.added"  # "<commit LSN>:<seq>" of the first change that had the column
FILL_META = "pglogrepl.fill"  # what rows from before that change hold, as PostgreSQL prints it
# A column's attribute number in the source table. PostgreSQL never reuses one, so a column new
# to the lake with the number of a column it knows is that column under a new name: a rename.
ATTNUM_META = "pglogrepl.attnum"
SOURCE_KEY = SOURCE_META.encode()


@dataclass(frozen=True)
class Evolution:
    """A changelog batch against what the lake knows of its table."""

    schema: pa.Schema  # the union: every column seen so far, the batch's own metadata columns
    added: tuple[str, ...]  # columns the lake sees for the first time, in batch order
    vanished: tuple[str, ...] = ()  # columns the lake has that the batch does not

    creating: bool = False  # the changelog table does not exist yet
    # The key as the lake knew it and as the batch has it, when they differ only by names the
    # lake lost and names new to it: renamed key columns, if ``with_origins`` says so.
    key_change: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    @property
    def needs_origins(self) -> bool:
        """Whether to ask the catalog (``with_origins``): for new columns, and for every column
        when the changelog is created (their attribute numbers)."""
        return bool(self.added) or self.creating

    @property
    def asked(self) -> tuple[str, ...]:
        """The columns to ask the catalog about."""
        if self.creating:
            return tuple(f.name for f in base_fields(self.schema) if f.name not in self.vanished)
        return self.added


def base_fields(schema: pa.Schema) -> list[pa.Field]:
    """The table's own columns of a changelog or state schema (no metadata columns)."""
    return [f for f in schema if f.name not in META_COLUMNS]


def evolve(table: str, known: pa.Schema | None, batch: pa.Schema, *, first: str) -> Evolution:
    """The union of ``known`` (a changelog or state schema, None: nothing yet) and ``batch``.

    ``first`` (``"<commit LSN>:<seq>"`` of the batch's first row) marks columns new to the lake.

    :raises IncompatibleSchemaChangeError: a column changed its lake type, or the table its key
        or replica identity.
    """
    import pyarrow as pa

    if known is None:
        return Evolution(batch, (), creating=True)
    seen = {f.name: f for f in base_fields(known)}
    sent = base_fields(batch)
    for field in sent:
        before = seen.get(field.name)
        if before is not None and not _same_type(before.type, field.type):
            raise IncompatibleSchemaChangeError(
                table, f"column {field.name!r} changed type from {before.type} to {field.type}"
            )
    had_key, has_key = described_key(_pairs(known)), described_key(_pairs(batch))
    key_change = None
    if had_key != has_key:
        gone = {k for k in had_key if k not in {f.name for f in sent}}
        new = {k for k in has_key if k not in seen}
        maybe_renamed = len(had_key) == len(has_key) and all(
            a == b or (a in gone and b in new) for a, b in zip(had_key, has_key, strict=True)
        )
        if not maybe_renamed:
            raise IncompatibleSchemaChangeError(
                table, f"its replica identity key changed from {had_key} to {has_key}"
            )
        key_change = (tuple(had_key), tuple(has_key))
    if OP in known.names and described_identity(_pairs(known)) != described_identity(_pairs(batch)):
        raise IncompatibleSchemaChangeError(
            table,
            f"its REPLICA IDENTITY changed from {described_identity(_pairs(known))!r} to "
            f"{described_identity(_pairs(batch))!r}",
        )
    by_name = {f.name: f for f in sent}
    fields = [_merged(f, by_name.get(f.name)) for f in seen.values()]
    added = [f for f in sent if f.name not in seen]
    fields += [f.with_metadata({**(f.metadata or {}), ADDED_META.encode(): first.encode()})
               for f in added]  # fmt: skip
    meta = [_merged_meta(f, known, fields) for f in batch if f.name in META_COLUMNS]
    vanished = tuple(name for name in seen if name not in by_name)
    return Evolution(pa.schema(fields + meta), tuple(f.name for f in added), vanished,
                     creating=OP not in known.names, key_change=key_change)  # fmt: skip


def _merged_meta(field: pa.Field, known: pa.Schema, fields: list[pa.Field]) -> pa.Field:
    import pyarrow as pa

    if field.name == OLD:
        return pa.field(OLD, pa.struct([pa.field(f.name, f.type) for f in fields]))
    if field.name == OP and OP in known.names:
        return _merged(known.field(OP), field)
    return field


def with_origins(
    table: str, known: pa.Schema | None, evolution: Evolution, origins: ColumnOrigins
) -> pa.Schema:
    """The evolved schema with what the catalog says of ``evolution.asked``: attribute numbers
    (``pglogrepl.attnum``) and each added column's fill (``pglogrepl.fill``), and renames
    applied: an added column with the attribute number of a column the lake knows is that
    column under a new name (``renames`` of the result tells which).

    :raises IncompatibleSchemaChangeError: a rename the lake cannot tell from a drop and an add
        (a column it knows without a number), or a renamed column whose lake type changed.
    :raises ColumnBackfillError: a column's existing rows hold values neither the catalog nor
        the changes reveal (a volatile default made PostgreSQL rewrite the table).
    """
    import pyarrow as pa

    seen = base_fields(known) if known is not None else []
    numbered = {_attnum(f): f.name for f in seen if _attnum(f)}
    unknown = [f.name for f in seen if f.name in evolution.vanished and _attnum(f) is None]
    if unknown and evolution.added:
        raise IncompatibleSchemaChangeError(
            table,
            f"columns {unknown} are gone and {list(evolution.added)} are new: a RENAME COLUMN, "
            f"or a DROP and an ADD, which the lake cannot tell apart here",
        )
    renames: dict[str, str] = {}
    fields = []
    for field in evolution.schema:
        origin = origins.columns.get(field.name)
        if origin is not None and origin.attnum is not None:
            if field.name in evolution.added and origin.attnum in numbered:
                renames[numbered[origin.attnum]] = field.name
                continue
            field = _with(field, ATTNUM_META, str(origin.attnum))
        elif field.name in unknown:  # gone before the lake asked: no number will ever match it
            field = _with(field, ATTNUM_META, "0")
        if field.name in evolution.added and origin is not None:
            if origin.missing is not None:
                field = _with(field, FILL_META, origin.missing)
            elif origin.has_default:
                raise ColumnBackfillError(table, field.name)
        fields.append(field)
    schema = pa.schema(fields)
    if renames:
        schema = _renamed(table, schema, renames, evolution.schema)
    check_key(table, evolution, renames)
    return schema


def check_key(table: str, evolution: Evolution, renames: Mapping[str, str]) -> None:
    """Refuse a changed key that ``renames`` does not explain.

    :raises IncompatibleSchemaChangeError: the key is other columns than it was.
    """
    if evolution.key_change is None:
        return
    had, has = evolution.key_change
    if tuple(renames.get(k, k) for k in had) != has:
        raise IncompatibleSchemaChangeError(
            table, f"its replica identity key changed from {list(had)} to {list(has)}"
        )


def _renamed(table: str, schema: pa.Schema, renames: Mapping[str, str],
             sent: pa.Schema) -> pa.Schema:  # fmt: skip
    """``schema`` with each renamed column under its new name, where it was, with what the
    lake recorded of it (attnum, fill, key) and its former names (``FORMER_META``); among
    ``_old``'s fields too. The new name's own field (the batch's) is taken for its type and
    source name only."""
    import json

    import pyarrow as pa

    def renamed(field: pa.Field) -> pa.Field:
        new = sent.field(renames[field.name])
        if not _same_type(field.type, new.type):
            raise IncompatibleSchemaChangeError(
                table, f"column {field.name!r} was renamed to {new.name!r} and changed type "
                f"from {field.type} to {new.type}",
            )  # fmt: skip
        meta = {k: v for k, v in (field.metadata or {}).items() if k != SOURCE_KEY}
        source = (new.metadata or {}).get(SOURCE_KEY)
        if source is not None:
            meta[SOURCE_KEY] = source
        formers = [*json.loads(_meta(field, FORMER_META) or "[]"), field.name]
        meta[FORMER_META.encode()] = json.dumps(formers).encode()
        return pa.field(new.name, field.type, field.nullable, metadata=meta)

    fields = []
    for field in schema:
        if field.name in renames:
            fields.append(renamed(field))
        elif field.name == OLD and pa.types.is_struct(field.type):
            children = [c.with_name(renames.get(c.name, c.name)) for c in field.type
                        if c.name not in renames.values()]  # fmt: skip
            fields.append(field.with_type(pa.struct(children)))
        else:
            fields.append(field)
    return pa.schema(fields)


def numbered(schema: pa.Schema, attnums: Mapping[str, int]) -> pa.Schema:
    """``schema`` with the attribute number of each column in ``attnums`` (a snapshot's)."""
    import pyarrow as pa

    return pa.schema(
        [_with(f, ATTNUM_META, str(attnums[f.name])) if f.name in attnums else f for f in schema]
    )


def _with(field: pa.Field, key: str, value: str) -> pa.Field:
    return field.with_metadata({**(field.metadata or {}), key.encode(): value.encode()})


def attnum(field: pa.Field) -> int | None:
    """A lake column's attribute number in its source table (None: not recorded)."""
    return _attnum(field)


def _attnum(field: pa.Field) -> int | None:
    text = _meta(field, ATTNUM_META)
    return None if text is None else int(text)


def fill_value(field: pa.Field) -> Any | None:
    """The value the rows from before ``field`` was added hold (None: NULL), typed for the lake."""
    from airflow_pglogrepl.pgoutput.values import from_text

    text = _meta(field, FILL_META)
    if text is None:
        return None
    oid, modifier = column_type(field)
    value = text if oid is None else from_text(oid, text)
    return arrow_value(value, oid, modifier)


def added_at(field: pa.Field) -> tuple[int, int] | None:
    """``(commit LSN, seq)`` of the first change that carried ``field`` (None: always there)."""
    text = _meta(field, ADDED_META)
    if text is None:
        return None
    lsn, _, seq = text.partition(":")
    return int(lsn), int(seq)


def first_row(batch: pa.Table) -> str:
    """``"<commit LSN>:<seq>"`` of a changelog batch's first row."""
    return f"{batch.column(COMMIT_LSN)[0].as_py()}:{batch.column(SEQ)[0].as_py()}"


def conform(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    """``batch`` with ``schema``'s columns: the ones it lacks (dropped at the source) as NULL."""
    import pyarrow as pa

    if batch.schema.equals(schema, check_metadata=True):
        return batch
    columns = []
    for field in schema:
        if field.name not in batch.column_names:
            columns.append(pa.nulls(batch.num_rows, field.type))
        elif field.name == OLD:
            columns.append(_conform_struct(batch.column(OLD), field.type))
        else:
            columns.append(batch.column(field.name))
    return pa.Table.from_arrays(columns, schema=schema)


def describe(schema: pa.Schema) -> dict[str, Any]:
    """A JSON-able summary of how the lake evolved a table (for logs and the run summary)."""
    return {
        f.name: {k: _meta(f, k) for k in (ADDED_META, FILL_META) if _meta(f, k) is not None}
        for f in base_fields(schema)
        if _meta(f, ADDED_META) is not None
    }


def _conform_struct(column: pa.ChunkedArray, struct_type: pa.StructType) -> pa.ChunkedArray:
    import pyarrow as pa

    chunks = []
    for chunk in column.chunks:
        have = {chunk.type.field(i).name for i in range(chunk.type.num_fields)}
        children = [
            chunk.field(child.name) if child.name in have else pa.nulls(len(chunk), child.type)
            for child in struct_type
        ]
        chunks.append(pa.StructArray.from_arrays(children, fields=list(struct_type),
                                                 mask=chunk.is_null()))  # fmt: skip
    return pa.chunked_array(chunks, type=struct_type)


def _merged(before: pa.Field, now: pa.Field | None) -> pa.Field:
    """A known column with what the lake recorded of it and what the batch says of it now."""
    if now is None:
        return before
    metadata = {**(before.metadata or {}), **(now.metadata or {})}
    for key in (KEY_META.encode(),):  # the key as it is now (checked equal above)
        if now.metadata is None or key not in now.metadata:
            metadata.pop(key, None)
    return now.with_metadata(metadata)


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    import pyarrow as pa

    from airflow_pglogrepl.lake.delta import column_types

    return column_types(pa.schema([pa.field("c", a)])) == column_types(
        pa.schema([pa.field("c", b)])
    )


def _pairs(schema: pa.Schema) -> Sequence[tuple[str, Mapping[str, Any] | None]]:
    return [
        (f.name, {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}) for f in schema
    ]


def _meta(field: pa.Field, key: str) -> str | None:
    value = (field.metadata or {}).get(key.encode())
    return None if value is None else value.decode()


__all__ = [
    "ADDED_META",
    "ATTNUM_META",
    "FILL_META",
    "FORMER_META",
    "TYPE_META",
    "Evolution",
    "added_at",
    "base_fields",
    "check_key",
    "conform",
    "describe",
    "evolve",
    "fill_value",
    "first_row",
    "with_origins",
]
