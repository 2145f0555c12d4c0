"""A table's first state too big to reduce in memory at once, reduced bucket by bucket.

Why: a first state is its whole batch reduced to one row per key, and held in memory at once
that costs several times the batch (40,000 rows of 16 KiB peaked at 2.7 GiB). Split by key hash
on local disk (``merge.buckets``), each bucket reduces alone to the rows the whole batch would
give, and is written as it is reduced (``merge.state_files``): memory follows a bucket. What
this path cannot take (keys it cannot hash, a batch bigger than the disk or than the buckets, a
hot key) is declined with the reason, for Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import TRUNCATE
from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake.column_names import former_names, with_current_names
from airflow_pglogrepl.merge.buckets import (
    FOLDER_ENV,
    MAX_BUCKET_BYTES,
    MAX_BUCKETS,
    Buckets,
    bucket_count,
    can_hash,
    free_bytes,
)
from airflow_pglogrepl.merge.net_upserts import (
    DELETE_COLUMN,
    net_upserts,
    updates_of_missing_rows,
)
from airflow_pglogrepl.merge.state_files import StateTarget

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.merge.changes_range import InRange

log = logging.getLogger("airflow_pglogrepl.lake")


class DeclinedError(Exception):
    """Raised inside a streamed write to decline the table (files written so far go)."""


def missing_row(name: str, key: Any) -> LakeError:
    """The error of an update whose unchanged TOAST values have no row to be kept from."""
    return LakeError(
        f"changes of {name} hold an update whose unchanged TOAST values have no earlier "
        f"version to keep: row {key} is neither in the state nor inserted earlier. "
        f"Nothing was merged. Fix: re-snapshot the table (tables=[...])"
    )


def wanted(net: pa.Table, state: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """The net change's schema with the state's own type for each table column."""
    import pyarrow as pa

    return pa.schema([state.field(f.name) if f.name in columns else f for f in net.schema])


def in_buckets(lake: Lake, name: str, end: LSN, in_range: InRange, size: int,
               schema: pa.Schema, state: pa.Schema, *, keys: list[str], columns: list[str],
               needed: list[str]) -> str | None:  # fmt: skip
    """A first state too big to reduce in memory at once: the batch split by key hash into
    buckets on local disk (``merge.buckets``), each reduced alone (a key's changes all hash to
    its bucket) and written as it is reduced, then created in one commit. Declined (for Spark)
    when the keys cannot be hashed here or local disk cannot hold the batch. ``schema``: the
    changelog's; ``state``: the first state's; ``needed``: the changelog columns to read."""
    import pyarrow.compute as pc

    if not all(can_hash(schema.field(k).type) for k in keys):
        return f"{in_range.count()} changes, keys of a type this path cannot split by hash"
    if size > MAX_BUCKETS * MAX_BUCKET_BYTES:
        return f"{in_range.count()} changes, about {size >> 30} GiB: more than buckets hold"
    room = free_bytes()
    if room < 2 * size:
        return (f"{in_range.count()} changes, about {size >> 20} MiB, more than half the "
                f"{room >> 20} MiB free where they would be split (set {FOLDER_ENV} to a "
                f"bigger local folder)")  # fmt: skip
    if TRUNCATE in in_range.operations():
        return "a TRUNCATE or a key change"
    values = [c for c in columns if c not in keys]
    formers = former_names(schema)
    with Buckets(bucket_count(size), keys) as buckets:
        for batch in in_range.batches(needed):
            buckets.add(batch)
            _check_split(buckets, in_range, room)
        del batch
        if buckets.rows() != in_range.count():  # the changelog moved under the read
            raise LakeError(f"changes of {name}: {buckets.rows()} rows split, "
                            f"{in_range.count()} in range; nothing was merged")  # fmt: skip
        with StateTarget(lake, name, state, None, end) as files:
            for k in range(buckets.count):
                part = buckets.take(k)
                if part is None:
                    continue
                net = net_upserts(with_current_names(part, formers), keys, values)
                del part
                if net is None:
                    raise DeclinedError("a TRUNCATE or a key change")
                missing = updates_of_missing_rows(None, net, keys, values)
                if missing:
                    raise missing_row(name, missing[0])
                try:
                    source = net.cast(wanted(net, state, columns))
                except (ValueError, NotImplementedError) as exc:  # Arrow's errors are both
                    raise DeclinedError(f"types the state holds differently ({exc})") from None
                files.write(source.filter(pc.invert(source.column(DELETE_COLUMN))).select(columns))
                del net, source
            rows = files.commit()
    log.info("state of %s written up to %s without a JVM, in %d buckets (%d changes, %d rows)",
             name, end, buckets.count, in_range.count(), rows)  # fmt: skip
    return None


def _check_split(buckets: Buckets, in_range: InRange, room: int) -> None:
    """Decline as soon as the split outgrows what it was sized for (an estimate low for rows
    that grow, or for repeated values Parquet stores small), before it fills the disk: a bucket
    above ``MAX_BUCKET_BYTES`` (a key with that many changes, or rows bigger than sized), or
    more written than half the free space."""
    biggest = buckets.largest_bytes()
    if biggest > MAX_BUCKET_BYTES:
        raise DeclinedError(
            f"{in_range.count()} changes, a bucket of {biggest >> 20} MiB (more than "
            f"{MAX_BUCKET_BYTES >> 20} MiB: a key with that many changes, or rows bigger "
            f"than sized)"
        )
    if 2 * buckets.written_bytes() > room:
        raise DeclinedError(
            f"{in_range.count()} changes, more than half the {room >> 20} MiB free where they "
            f"are split (set {FOLDER_ENV} to a bigger local folder)"
        )
