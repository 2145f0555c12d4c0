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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_pglogrepl.changelog.columns import COMMIT_LSN
from airflow_pglogrepl.merge.changes_range import InRange

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from airflow_pglogrepl.merge.history_changes import TableChanges

BATCH_BYTES = 64 << 20  # Arrow bytes of changes one step reduces, about


def steps(table: TableChanges, have: int | None, end: int, limit: int | None = None) -> list[int]:
    """The ends of the steps that take the history from ``have`` to ``end``, ascending, the
    last ``end``; each about ``limit`` bytes (default ``BATCH_BYTES``). Sized by the bytes per
    change of the range's estimate (``InRange``); the commit LSNs alone are read (as distinct
    values and their counts), never the rows."""
    limit = BATCH_BYTES if limit is None else limit
    size = table.size_bytes(have, end)
    if size <= limit:
        return [end]
    lsns, counts = _transactions(InRange(table.changes, table.schema, have, end))
    total = int(counts.sum())
    if total == 0:
        return [end]
    per_change = max(1, size // total)
    ends: list[int] = []
    held = 0
    for at, count in zip(lsns.tolist(), counts.tolist(), strict=True):
        if held and (held + count) * per_change > limit:
            ends.append(int(at))  # (the range before it: changes below ``at``)
            held = 0
        held += count
    return [*ends, end]


def _transactions(in_range: InRange) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The distinct commit LSNs in range, ascending, and how many changes each has: 16 bytes a
    transaction, read batch by batch."""
    import numpy as np
    import pyarrow.compute as pc

    found_lsns, found_counts = [], []
    for batch in in_range.batches([COMMIT_LSN]):
        counted = pc.value_counts(batch.column(COMMIT_LSN))
        found_lsns.append(counted.field("values").to_numpy(zero_copy_only=False))
        found_counts.append(counted.field("counts").to_numpy(zero_copy_only=False))
    if not found_lsns:
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    lsns, where = np.unique(np.concatenate(found_lsns), return_inverse=True)
    counts = np.bincount(where, weights=np.concatenate(found_counts)).astype(np.int64)
    return lsns, counts
