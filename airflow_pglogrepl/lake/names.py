"""The name a source column has in the lake, assigned once and kept.

PostgreSQL allows any column name: spaces, ``=``, parentheses, tabs, unicode, and two names
that differ only by case (``"Name"`` and ``name``). Delta Lake stores most of those under
column mapping, but compares names without case, so no Delta schema holds both ``Name`` and
``name``, and a source column named like one of the changelog's own columns (``_op``) would
collide with it. Each source column therefore gets a *lake name*: its own name when that is
free, else ``<name>__<k>`` with the smallest ``k >= 2`` that is free, case-insensitively.

A lake name is assigned the first time the lake sees the column (by ``attnum``, in attnum
order, so a table's columns are named the same way whatever order a batch lists them in) and
recorded with the column; it is never computed again. A later column can therefore never take
an earlier one's name, and a drop and re-add of a column under an old name gets a fresh one.

Which lake names need Delta's column mapping at all: those with a character Delta refuses in
a plain schema (``needs_mapping``). A table whose names need none keeps a plain schema, which
every Delta reader reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Characters Delta Lake (Spark's writer, delta-rs) refuses in a column name without column
# mapping.
REFUSED_WITHOUT_MAPPING = frozenset(" ,;{}()\n\t=")


@dataclass(frozen=True)
class SourceColumn:
    """A column as the source knows it: its ``attnum`` (stable across renames) and name."""

    attnum: int
    name: str


def needs_mapping(name: str) -> bool:
    """Whether a lake name can only be stored with Delta's column mapping."""
    return bool(REFUSED_WITHOUT_MAPPING.intersection(name))


def assign(
    columns: Sequence[SourceColumn],
    recorded: Mapping[int, str],
    *,
    reserved: Iterable[str] = (),
) -> dict[int, str]:
    """``attnum -> lake name`` for ``columns``: a recorded name is kept as it is; a new column
    (in attnum order) gets its own name unless a recorded, reserved or earlier assigned name
    equals it without case, in which case ``<name>__<k>`` for the smallest free ``k >= 2``.

    ``recorded`` holds the lake names of the columns the lake already has (dropped ones
    included: their names stay taken, so a value never changes meaning under one name);
    ``reserved`` the names of the lake's own columns (the changelog's ``_op``, ``_seq`` ...).
    """
    taken: set[str] = set()
    for name in (*recorded.values(), *reserved):
        taken |= _keys(name)
    assigned: dict[int, str] = {}
    for column in sorted(columns, key=lambda c: c.attnum):
        if column.attnum in recorded:
            assigned[column.attnum] = recorded[column.attnum]
            continue
        if column.attnum in assigned:
            raise ValueError(f"attnum {column.attnum} is given twice: {columns!r}")
        name = _free(column.name, taken)
        taken |= _keys(name)
        assigned[column.attnum] = name
    return assigned


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
