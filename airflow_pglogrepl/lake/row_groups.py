"""Parquet row groups cut by bytes, for every file the lake writes.

Why: a reader decodes a row group whole, so its bytes bound the reader's memory. pyarrow's
default, a million rows a group, made one of 313 MiB for rows of 16 KiB, and a group sized by
the average row of a batch still holds all of a batch's few big rows together. Cut here by the
Arrow bytes of the rows themselves, a group holds about ``ROW_GROUP_BYTES`` however uneven the
rows are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

ROW_GROUP_BYTES = 32 << 20  # Arrow bytes of one Parquet row group the lake writes, about


def pieces(rows: pa.Table, limit_bytes: int) -> Iterator[pa.Table]:
    """``rows`` cut into consecutive slices of at most ``limit_bytes`` of Arrow data each (or
    one row): halved until each part fits, so rows of uneven sizes are cut where they are big,
    then neighbours joined again while they fit."""
    start = held = 0
    for at, part in _halves(rows, 0, limit_bytes):
        if held and held + part.nbytes > limit_bytes:
            yield rows.slice(start, at - start)
            start, held = at, 0
        held += part.nbytes
    if rows.num_rows > start:
        yield rows.slice(start)


def _halves(rows: pa.Table, at: int, limit_bytes: int) -> Iterator[tuple[int, pa.Table]]:
    if rows.num_rows <= 1 or rows.nbytes <= limit_bytes:
        if rows.num_rows:
            yield at, rows
        return
    half = rows.num_rows // 2
    yield from _halves(rows.slice(0, half), at, limit_bytes)
    yield from _halves(rows.slice(half), at + half, limit_bytes)


def write_rows(writer: Any, rows: pa.Table) -> None:
    """Write ``rows`` through a Parquet writer in row groups of about ``ROW_GROUP_BYTES``."""
    for piece in pieces(rows, ROW_GROUP_BYTES):
        writer.write_table(piece, row_group_size=piece.num_rows)
