"""Delta column mapping (``delta.columnMapping.mode = name``) for tables whose names need it.

Under column mapping a table's schema says, for every field, an id and a *physical name*: the
name its Parquet files use. Readers that support it (Spark with Delta, delta-rs' query engine)
show the logical names, so a column may be called anything PostgreSQL allows. delta-rs 1.6
reads and appends to such tables but cannot create one with data, nor change its schema; the
lake therefore builds the schema itself (``mapped_schema``), writes files under the physical
names (``to_physical``), and creates the table with its own version-0 commit
(``delta.create_table(..., mapping=...)``).

Physical names are ``col-<uuid>`` (as Spark makes them), except the changelog's own columns,
which keep their names: ``_commit_lsn`` must stay ``_commit_lsn`` in the files for the
statistics the lake records and the window filters that read them. Nested struct fields (a
changelog's ``_old``) get ids and physical names too. A physical name never changes: a rename
is a new logical name over the same files.

The protocol of a mapped table is always reader 3 / writer 7 with the ``columnMapping`` feature.
With the older reader 2 / writer 5 form, ``deltalake``'s pyarrow readers read every column of
such a table as NULL without an error; with table features they refuse it, which a user sees.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import META_COLUMNS, OLD
from airflow_pglogrepl.lake.column_names import needs_mapping, same_without_case

if TYPE_CHECKING:
    import pyarrow as pa


MODE = "delta.columnMapping.mode"
MAX_ID = "delta.columnMapping.maxColumnId"
ID_KEY = "delta.columnMapping.id"
PHYSICAL_KEY = "delta.columnMapping.physicalName"
FEATURE = "columnMapping"
PARQUET_ID = b"PARQUET:field_id"
# What a table is created with to be under column mapping, by Spark's writer too: reader 3 /
# writer 7 asked for, and the feature named, or Spark makes an older form when no other feature
# needs table features (reader 2 / writer 5, or reader 2 / writer 7 with the feature among the
# writer's only), and deltalake's pyarrow readers then read NULLs (the module docstring).
PROTOCOL_KEYS = {"delta.minReaderVersion": "3", "delta.minWriterVersion": "7",
                 f"delta.feature.{FEATURE}": "supported"}  # fmt: skip
TABLE_CONFIG = {MODE: "name", **PROTOCOL_KEYS}


@dataclass(frozen=True)
class MappedSchema:
    """A table's Delta schema under column mapping: its JSON (for the log) and the highest id."""

    schema: dict[str, Any]
    max_id: int

    def to_json(self) -> str:
        return json.dumps(self.schema, separators=(",", ":"))

    def configuration(self) -> dict[str, str]:
        """What the table's configuration says of its mapping."""
        return {MODE: "name", MAX_ID: str(self.max_id)}


def mapped_schema(
    schema: pa.Schema,
    *,
    pinned: Iterable[str] = META_COLUMNS,
    previous: MappedSchema | None = None,
    as_named: bool = False,
) -> MappedSchema:
    """``schema`` as a Delta schema with every field, nested ones included, given an id (depth
    first) and a physical name: its own for a top-level name of ``pinned`` (the changelog's
    columns, by default: ``_commit_lsn``'s statistics are kept under its name), else
    ``col-<uuid>``. delta-rs converts the types, keeps each field's metadata (the lake's
    ``pglogrepl.*`` keys) and refuses two names that differ only by case.

    ``previous`` is the table's mapping so far: a field it has (by name, at the same place)
    keeps its id and physical name, and new ones get ids above its highest. ``as_named`` gives
    every new field its own name as physical name: what a table that had no mapping gets, its
    files holding those names already."""
    import pyarrow as pa
    from deltalake import Schema

    converted: dict[str, Any] = json.loads(Schema.from_arrow(schema).to_json())
    keep = set(pinned)
    counter = [0 if previous is None else previous.max_id]

    def visit(kind: Any, arrow: pa.DataType, before: Any, top: bool) -> None:
        if isinstance(kind, dict) and kind.get("type") == "struct":
            had = {}
            if isinstance(before, dict) and before.get("type") == "struct":
                had = {f["name"]: f for f in before["fields"]}
            for field, arrow_field in zip(kind["fields"], _children(arrow), strict=True):
                old = had.get(field["name"])
                metadata = {k: v for k, v in field.get("metadata", {}).items()
                            if not k.startswith("delta.columnMapping.")}  # fmt: skip
                if old is not None:
                    ids = {ID_KEY: old["metadata"][ID_KEY],
                           PHYSICAL_KEY: old["metadata"][PHYSICAL_KEY]}  # fmt: skip
                else:
                    counter[0] += 1
                    own = as_named or (top and field["name"] in keep)
                    physical = field["name"] if own else f"col-{uuid.uuid4()}"
                    ids = {ID_KEY: counter[0], PHYSICAL_KEY: physical}
                field["metadata"] = {**metadata, **ids}
                visit(field["type"], arrow_field.type, None if old is None else old["type"], False)
        elif isinstance(kind, dict) and kind.get("type") == "array":
            element = before.get("elementType") if isinstance(before, dict) else None
            visit(kind["elementType"], arrow.value_type, element, False)
        elif isinstance(kind, dict) and kind.get("type") == "map":
            raise ValueError(f"map columns are not supported under column mapping: {schema}")

    visit(converted, pa.struct(list(schema)), None if previous is None else previous.schema, True)
    return MappedSchema(converted, counter[0])


def needed(schema: pa.Schema) -> bool:
    """Whether a lake schema has a name (a column's, or a field's of ``_old``) that Delta
    stores only under column mapping."""
    import pyarrow as pa

    names = [f.name for f in schema]
    if OLD in schema.names and pa.types.is_struct(schema.field(OLD).type):
        names += [c.name for c in schema.field(OLD).type]
    return any(needs_mapping(n) for n in names)


def is_mapped(table: Any) -> bool:
    """Whether an open ``DeltaTable`` is under column mapping (its files hold physical names)."""
    return str((table.metadata().configuration or {}).get(MODE, "none")) != "none"


def mapped_of(table: Any) -> MappedSchema | None:
    """The mapping of an open ``DeltaTable`` (None: not under column mapping), read from its
    Delta schema: its physical names are the files', whatever its logical names became."""
    if not is_mapped(table):
        return None
    schema = json.loads(table.schema().to_json())
    return MappedSchema(schema, int((table.metadata().configuration or {}).get(MAX_ID, "0")))


def spelled_out(protocol: dict[str, Any]) -> dict[str, Any]:
    """A log's ``protocol`` action with column mapping named among the reader's features.

    Spark writes a mapped table that needs no other reader feature as reader version 2 (which
    implies column mapping without naming it), and ``deltalake``'s pyarrow readers read every
    column of such a table as NULL, without an error. Named, they refuse it (and Spark, or
    ``deltalake``'s query engine, reads it)."""
    if protocol.get("minReaderVersion") != 2:
        return protocol
    writer, features = int(protocol["minWriterVersion"]), protocol.get("writerFeatures")
    return with_mapping_feature(2, writer, protocol.get("readerFeatures"), features)


def with_mapping_feature(reader: int, writer: int, reader_features: Sequence[str] | None,
                         writer_features: Sequence[str] | None) -> dict[str, Any]:  # fmt: skip
    """A protocol with the ``columnMapping`` feature: reader 3 / writer 7, the features a
    legacy version implies spelled out (Delta's protocol table), so none is dropped."""
    implied_writer = {2: ["appendOnly", "invariants"], 3: ["checkConstraints"],
                      4: ["changeDataFeed", "generatedColumns"], 5: [FEATURE],
                      6: ["identityColumns"]}  # fmt: skip
    writers = list(writer_features or [])
    if writer < 7:
        writers = [f for v in range(2, writer + 1) for f in implied_writer[v]]
    readers = list(reader_features or []) if reader >= 3 else []
    return {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": [*readers, *([FEATURE] if FEATURE not in readers else [])],
        "writerFeatures": [*writers, *([FEATURE] if FEATURE not in writers else [])],
    }


def physical_names(mapped: MappedSchema) -> list[str]:
    """The physical names of the schema's top-level fields, in order."""
    return [str(f["metadata"][PHYSICAL_KEY]) for f in mapped.schema["fields"]]


def to_physical(table: pa.Table, mapped: MappedSchema) -> pa.Table:
    """``table`` (columns in the schema's order) with every field renamed, by position, to its
    physical name and tagged with its id (``PARQUET:field_id``, as Spark writes it): what a
    mapped table's data files hold. Struct children are rebuilt, not cast: a cast matches
    struct fields by name and would read the renamed ones as NULL."""
    import pyarrow as pa

    fields = mapped.schema["fields"]
    if [f["name"] for f in fields] != table.column_names:
        raise ValueError(
            f"columns {table.column_names} are not the mapped schema's "
            f"{[f['name'] for f in fields]}"
        )
    columns = [
        pa.chunked_array(
            [_physical_array(chunk, f["type"]) for chunk in column.chunks],
            type=_physical_type(f["type"], column.type),
        )
        for column, f in zip(table.columns, fields, strict=True)
    ]
    schema = pa.schema(
        _physical_field(f, field) for f, field in zip(fields, table.schema, strict=True)
    )
    return pa.Table.from_arrays(columns, schema=schema)


# -- helpers ------------------------------------------------------------------------------------


def _children(kind: pa.DataType) -> list[pa.Field]:
    return [kind.field(i) for i in range(kind.num_fields)]


def _physical_field(delta_field: dict[str, Any], field: pa.Field) -> pa.Field:
    import pyarrow as pa

    meta = delta_field["metadata"]
    return pa.field(
        str(meta[PHYSICAL_KEY]),
        _physical_type(delta_field["type"], field.type),
        field.nullable,
        metadata={**(field.metadata or {}), PARQUET_ID: str(meta[ID_KEY]).encode()},
    )


def _physical_type(kind: Any, arrow: pa.DataType) -> pa.DataType:
    """``arrow`` with its struct fields, at any depth, under their physical names. The fields
    are matched by position, so their names are checked: a struct whose children come in
    another order than the table's would otherwise store each value in its neighbour's
    column."""
    import pyarrow as pa

    if isinstance(kind, dict) and kind.get("type") == "struct":
        children = _children(arrow)
        given = [c.name for c in children]
        wanted = [str(f["name"]) for f in kind["fields"]]
        if given != wanted:
            raise ValueError(f"struct fields {given} are not the table's {wanted}, in order")
        return pa.struct([
            _physical_field(f, child) for f, child in zip(kind["fields"], children, strict=True)
        ])  # fmt: skip
    if isinstance(kind, dict) and kind.get("type") == "array":
        if not (pa.types.is_list(arrow) or pa.types.is_large_list(arrow)):
            raise ValueError(
                f"{arrow} is not supported under column mapping (a list or large list)"
            )
        value = arrow.value_field.with_type(_physical_type(kind["elementType"], arrow.value_type))
        return pa.large_list(value) if pa.types.is_large_list(arrow) else pa.list_(value)
    if isinstance(kind, dict):
        raise ValueError(f"{arrow} is not supported under column mapping")
    return arrow


def _physical_array(array: pa.Array, kind: Any) -> pa.Array:
    import pyarrow as pa

    if array.offset and isinstance(kind, dict):  # a slice: arrays built from its parts with a
        array = pa.concat_arrays([array])  # null mask must start at their buffers' start

    if isinstance(kind, dict) and kind.get("type") == "struct":
        fields = kind["fields"]
        children = [_physical_array(array.field(i), f["type"]) for i, f in enumerate(fields)]
        names = [_physical_field(f, array.type.field(i)) for i, f in enumerate(fields)]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=names, mask=mask)
    if (
        isinstance(kind, dict)
        and kind.get("type") == "array"
        and array.type.value_type != (_physical_type(kind["elementType"], array.type.value_type))
    ):
        values = _physical_array(array.values, kind["elementType"])
        kind_of = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
        physical = _physical_type(kind, array.type)
        return kind_of.from_arrays(array.offsets, values, type=physical, mask=array.is_null())
    return array


def renamed(mapped: MappedSchema, renames: dict[str, str], *,
            where: str = "the table") -> MappedSchema:  # fmt: skip
    """``mapped`` with ``renames`` (``old -> new`` logical names) applied at the top level and
    in ``_old``: the same ids and physical names, so the same files, under the new names.
    Refused (``ValueError`` naming ``where``): a name the schema lacks, a name of the
    changelog's own, two names of one struct equal without case."""
    schema = _renamed(json.loads(mapped.to_json()), renames, where)
    return MappedSchema(schema, mapped.max_id)


def _renamed(schema: dict[str, Any], renames: dict[str, str], uri: str) -> dict[str, Any]:
    """``schema`` (Delta JSON) with ``renames`` applied at the top level and in ``_old``."""
    top = [str(f["name"]) for f in schema["fields"]]
    missing = sorted(set(renames) - set(top))
    if missing:
        raise ValueError(f"{uri} has no column {missing}")
    if OLD in renames or any(new in META_COLUMNS for new in renames.values()):
        raise ValueError(f"renames {renames} touch the changelog's own columns of {uri}")
    for fields in [schema["fields"], *_old_children(schema)]:
        for field in fields:
            field["name"] = renames.get(field["name"], field["name"])
        names = [str(f["name"]) for f in fields]
        for i, a in enumerate(names):
            clash = next((b for b in names[i + 1 :] if same_without_case(a, b)), None)
            if clash is not None:
                raise ValueError(
                    f"renames {renames} would give {uri} the columns {a!r} and {clash!r}, "
                    f"which Delta takes for one"
                )
    return schema


def _old_children(schema: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [
        f["type"]["fields"]
        for f in schema["fields"]
        if f["name"] == OLD and isinstance(f["type"], dict) and f["type"].get("type") == "struct"
    ]
