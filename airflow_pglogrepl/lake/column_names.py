"""The name a source column has in the lake, assigned once and kept.

PostgreSQL allows any column name: spaces, ``=``, parentheses, tabs, unicode, and two names
that differ only by case (``"Name"`` and ``name``). Delta Lake stores most of those under
column mapping, but compares names without case, so no Delta schema holds both ``Name`` and
``name``, and a source column named like one of the changelog's own columns (``_op``) would
collide with it. Each source column therefore gets a *lake name*: its own name when that is
free, else ``<name>__<k>`` with the smallest ``k >= 2`` that is free, case-insensitively.

A lake name is assigned the first time the lake sees the column (in the source's column
order, attnum order, as pgoutput and the catalog list columns) and recorded with the column
(``SOURCE_META`` when it differs); it is never computed again, so a later column can never
take an earlier one's name.

Which lake names need Delta's column mapping at all: those with a character Delta refuses in
a plain schema (``needs_mapping``). A table whose names need none keeps a plain schema, which
every Delta reader reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_pglogrepl.changelog.columns import META_COLUMNS, OLD, OP, UNCHANGED

if TYPE_CHECKING:
    import pyarrow as pa

# Characters Delta Lake (Spark's writer, delta-rs) refuses in a column name without column
# mapping.
REFUSED_WITHOUT_MAPPING = frozenset(" ,;{}()\n\t=")
# On a table column whose lake name is not its source name: the source name.
SOURCE_META = "pglogrepl.source_name"
# On a column renamed at the source: the lake names it had before (JSON list, oldest first).
# They stay taken, so such a name in a changelog row written before the rename (an entry of
# ``_unchanged``) always means this column.
FORMER_META = "pglogrepl.former_names"


def needs_mapping(name: str) -> bool:
    """Whether a lake name can only be stored with Delta's column mapping."""
    return bool(REFUSED_WITHOUT_MAPPING.intersection(name))


def assign(
    sources: Sequence[str],
    recorded: Mapping[str, str],
    *,
    reserved: Iterable[str] = (),
) -> dict[str, str]:
    """``source name -> lake name`` for ``sources`` (a table's columns in the source's order,
    which is attnum order in pgoutput's Relation messages and in the catalog): a recorded name
    is kept as it is; a new column gets its own name unless a recorded, reserved or earlier
    assigned name equals it without case, in which case ``<name>__<k>`` for the smallest free
    ``k >= 2``.

    ``recorded`` maps the source names of the columns the lake already has to their lake names
    (dropped ones included: their names stay taken, so a value never changes meaning under one
    name); ``reserved`` holds the names of the lake's own columns (``_op``, ``_seq`` ...).
    """
    if len(set(sources)) != len(sources):
        raise ValueError(f"a column name is given twice: {list(sources)!r}")
    taken: set[str] = set()
    for name in (*recorded.values(), *reserved):
        taken |= _keys(name)
    assigned: dict[str, str] = {}
    for source in sources:
        if source in recorded:
            assigned[source] = recorded[source]
            continue
        name = _free(source, taken)
        taken |= _keys(name)
        assigned[source] = name
    return assigned


def recorded(schema: pa.Schema | None) -> dict[str, str]:
    """``source name -> lake name`` of the table columns a lake schema holds: a column's lake
    name, unless its metadata records another source name (``SOURCE_META``)."""
    if schema is None:
        return {}
    found = {}
    for field in schema:
        if field.name in META_COLUMNS:
            continue
        source = (field.metadata or {}).get(SOURCE_META.encode())
        found[field.name if source is None else source.decode()] = field.name
    return found


def lake_names(sources: Sequence[str], known: pa.Schema | None) -> dict[str, str]:
    """``source name -> lake name`` of a table's columns (``sources``, in the source's order),
    given what the lake knows of the table (``known``: None for a table new to it): its
    recorded names, and its own columns' and former names taken."""
    return assign(sources, recorded(known), reserved=(*META_COLUMNS, *former_names(known)))


def renamed_since(before: pa.Schema | None, after: pa.Schema) -> dict[str, str]:
    """``old lake name -> new lake name`` of the columns renamed between two lake schemas."""
    had = {f.name for f in before or () if f.name not in META_COLUMNS}
    found = {}
    for former, now in former_names(after).items():
        if former in had and now not in had:
            found[former] = now
    return found


def former_names(schema: pa.Schema | None) -> dict[str, str]:
    """``former lake name -> lake name now`` of every renamed column of a lake schema."""
    import json

    found: dict[str, str] = {}
    for field in schema or ():
        text = (field.metadata or {}).get(FORMER_META.encode())
        if field.name not in META_COLUMNS and text is not None:
            found.update(dict.fromkeys(json.loads(text), field.name))
    return found


def to_lake(batch: pa.Table, known: pa.Schema | None) -> tuple[pa.Table, dict[str, str]]:
    """A changelog batch (the source's columns, then the changelog's own: ``META_COLUMNS``)
    under its lake names, given what the lake knows of the table (``known``: None for a table
    new to it), and ``source name -> lake name`` of its table columns.

    Renamed everywhere a name appears: the column, its field among ``_old``'s, and its entries
    in ``_unchanged`` (a value readers match against the column's name). A renamed column
    records its source name in its metadata, so the next batch finds it (``recorded``).
    Columns are matched by position, not name: a source column may be called ``_op``."""
    import pyarrow as pa

    positions = set(_table_positions(batch.column_names))
    sources = [batch.column_names[i] for i in sorted(positions)]
    names = lake_names(sources, known)
    renamed = {s: names[s] for s in sources if names[s] != s}
    if not renamed:
        return batch, names
    columns, fields = list(batch.columns), list(batch.schema)
    for i, f in enumerate(batch.schema):
        if i in positions and f.name in renamed:
            meta = {**(f.metadata or {}), SOURCE_META.encode(): f.name.encode()}
            fields[i] = f.with_name(renamed[f.name]).with_metadata(meta)
        elif i in positions:
            continue
        elif f.name == UNCHANGED:
            columns[i] = _renamed_entries(columns[i], renamed)
        elif f.name == OLD:
            old_type = pa.struct([c.with_name(renamed.get(c.name, c.name)) for c in f.type])
            columns[i] = pa.chunked_array([c.view(old_type) for c in columns[i].chunks], old_type)
            fields[i] = f.with_type(old_type)
    schema = pa.schema(fields, metadata=batch.schema.metadata)
    return pa.Table.from_arrays(columns, schema=schema), names


def _table_positions(columns: Sequence[str]) -> list[int]:
    """Which of a changelog batch's columns are the table's. The changelog's own columns end
    a batch, in their order, so a table column named ``_op`` before them is the table's;
    a batch not ending so (built by hand) is taken by name."""
    width, after = len(columns), len(META_COLUMNS)
    while width and columns[width - 1] in META_COLUMNS:
        at = META_COLUMNS.index(columns[width - 1])
        if at >= after:
            break
        width, after = width - 1, at
    if width < len(columns) and OP in columns[width:]:
        return list(range(width))
    return [i for i, name in enumerate(columns) if name not in META_COLUMNS]


def with_current_names(batch: pa.Table, formers: Mapping[str, str]) -> pa.Table:
    """A changelog batch with each entry of ``_unchanged`` under its column's name now
    (``formers``: ``former_names`` of the table's schema)."""
    if not formers or UNCHANGED not in batch.column_names:
        return batch
    at = batch.column_names.index(UNCHANGED)
    return batch.set_column(at, batch.field(at), _renamed_entries(batch.column(at), formers))


def _renamed_entries(column: pa.ChunkedArray, renamed: Mapping[str, str]) -> pa.ChunkedArray:
    """``_unchanged`` lists with each name of ``renamed`` replaced by its new name, in one
    pass: a name is looked up once and never renamed again by a later entry of ``renamed``
    (``name`` -> ``name__2`` while a real ``name__2`` -> ``name__2__2``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sources = pa.array(list(renamed), pa.string())
    targets = pa.array(list(renamed.values()), pa.string())
    chunks = []
    for chunk in column.chunks:
        if chunk.offset:  # a slice: a list array built from its offsets and a null mask must
            chunk = pa.concat_arrays([chunk])  # start at its buffers' start
        values = chunk.values
        values = pc.coalesce(pc.take(targets, pc.index_in(values, value_set=sources)), values)
        mask = chunk.is_null() if chunk.null_count else None
        chunks.append(pa.ListArray.from_arrays(chunk.offsets, values, type=chunk.type, mask=mask))
    return pa.chunked_array(chunks, column.type)


def same_without_case(a: str, b: str) -> bool:
    """Whether Delta would take ``a`` and ``b`` for one column name."""
    return bool(_keys(a) & _keys(b))


def _keys(name: str) -> set[str]:
    # Spark lower-cases (Java's default case mapping), delta-rs too; casefold also folds what
    # lower() keeps apart (ß, ς). Taking either as a clash can only rename more, never clash.
    return {name.lower(), name.casefold()}


def _free(name: str, taken: set[str]) -> str:
    if not _keys(name) & taken:
        return name
    k = 2
    while _keys(f"{name}__{k}") & taken:
        k += 1
    return f"{name}__{k}"
