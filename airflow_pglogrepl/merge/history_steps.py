"""Where a history's catch-up is cut into steps of bounded size.

The reduction holds a batch whole in memory (each version's end is the next change of its key,
anywhere in the batch). A history far behind its changelog (turned on over a long changelog, or
an initial load through the slot) would hold every change at once, so its range is merged in
steps of about ``BATCH_BYTES`` of Arrow, each one Delta commit at a position of its own. (The
reduction holds several times its batch's bytes while it works: 64 MiB of changes peaked near
400 MiB. What bounds the MERGE's own memory is the history's size: delta-rs reads the files it
rewrites, which is why a big history's MERGE runs on Spark, ``merge.history_spark``.)

A step ends at a commit LSN, never inside a transaction: the history at a step's end includes
exactly the changes below it, as at any window end, and a crash between steps leaves it there
for the next run to go on from. Only one transaction bigger than a step is a step bigger than
``BATCH_BYTES``.

The steps are sized by each transaction's own bytes, not by the range's average: changes are
uneven (a few rows of 20 kB after many small ones), and a Parquet file's sizes say little of
the Arrow bytes of values it encodes by dictionary. The range is read once for that, batch by
batch, keeping 16 bytes a transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_pglogrepl.changelog.columns import COMMIT_LSN
from airflow_pglogrepl.merge.changes_range import InRange

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from airflow_pglogrepl.merge.history_changes import TableChanges

BATCH_BYTES = 64 << 20  # Arrow bytes of changes one step reduces, about
WEIGHED_ROWS = 10_000  # a range of more changes is weighed whatever its estimate says


def steps(table: TableChanges, have: int | None, end: int, limit: int | None = None) -> list[int]:
    """The ends of the steps that take the history from ``have`` to ``end``, ascending, the
    last ``end``; each about ``limit`` bytes (default ``BATCH_BYTES``)."""
    limit = BATCH_BYTES if limit is None else limit
    in_range = InRange(table.changes, table.schema, have, end)
    small = in_range.count() <= WEIGHED_ROWS
    if small and in_range.size_bytes(table.read_columns) * 16 <= limit:
        return [end]
    lsns, weights = _transactions(in_range, table.read_columns)
    if len(lsns) == 0:
        return [end]
    import numpy as np

    total = np.cumsum(weights)
    ends: list[int] = []
    start, base = 0, 0.0
    while True:
        cut = max(int(np.searchsorted(total, base + limit, side="right")), start + 1)
        if cut >= len(lsns):
            return [*ends, end]
        ends.append(int(lsns[cut]))  # (the step before it: changes below this commit LSN)
        start, base = cut, float(total[cut - 1])


def _transactions(in_range: InRange, columns: list[str]
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:  # fmt: skip
    """The distinct commit LSNs in range, ascending, and the Arrow bytes of each one's
    changes (``_row_bytes``), read batch by batch."""
    import numpy as np

    found_lsns, found_bytes = [], []
    for batch in in_range.batches(columns):
        lsn = batch.column(COMMIT_LSN).to_numpy()
        values, where = np.unique(lsn, return_inverse=True)
        found_lsns.append(values)
        found_bytes.append(np.bincount(where, weights=_row_bytes(batch)))
    if not found_lsns:
        return np.array([], dtype=np.int64), np.array([], dtype=np.float64)
    lsns, where = np.unique(np.concatenate(found_lsns), return_inverse=True)
    weights = np.bincount(where, weights=np.concatenate(found_bytes))
    return lsns.astype(np.int64), weights.astype(np.float64)


def _row_bytes(batch: pa.Table) -> npt.NDArray[np.float64]:
    """About how many Arrow bytes each row of ``batch`` holds: a string's or binary's length
    (and its offset), a fixed width, else the column's bytes shared evenly."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = np.zeros(batch.num_rows, dtype=np.float64)
    for column in batch.columns:
        kind = column.type
        if (
            pa.types.is_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_large_binary(kind)
        ):
            lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy()
            rows += lengths + 8
        elif _width(kind) >= 8:
            rows += _width(kind) // 8
        elif batch.num_rows:
            rows += column.nbytes / batch.num_rows
    return rows


def _width(kind: pa.DataType) -> int:
    """A fixed-width type's bits; 0 for the others."""
    import pyarrow as pa

    if pa.types.is_nested(kind):
        return 0
    try:
        return int(kind.bit_width)
    except ValueError:  # (not of a fixed width)
        return 0
