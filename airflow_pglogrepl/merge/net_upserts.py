"""The net change of a keyed batch, reduced in Arrow: one upsert or delete per touched key, for
the merge without a JVM (``merge.arrow``) and for Spark's merge of a batch reduced there
(``materialize.merge_reduced``), which both read its columns.

Why a batch with no ``TRUNCATE`` and no update that moved a row to another key reduces this
simply: a row never leaves its key, so its lineage (``merge.reduce``) is the key itself; and
because an INSERT sends every column, each column's latest value actually sent is the key's
latest: one group-by per key gives the net change. The last change deletes the row or upserts
it; columns never sent in the batch (unchanged TOAST values of a row the batch did not insert)
keep the target's value. So a net change says, beside each value, whether it was sent at all,
and whether its key was inserted in the batch: a value kept from the target needs a target row
to keep it from (``updates_of_missing_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    DELETE,
    INSERT,
    OLD,
    OP,
    SEQ,
    TRUNCATE,
    UNCHANGED,
    UPDATE,
)
from airflow_pglogrepl.merge.lineage import INTERNAL

if TYPE_CHECKING:
    import pyarrow as pa

# keys per IN list when the rows of unchanged values are looked up (``updates_of_missing_rows``)
IN_LIST_KEYS = 1_000

DELETE_COLUMN, _FILL = f"{INTERNAL}delete", f"{INTERNAL}fill_target"


def sent_column(i: int) -> str:
    """The column of a net change that says whether its ``i``-th value was sent at all."""
    return f"{INTERNAL}sent{i}"


def quote(name: str) -> str:
    """``name`` as an identifier of the DataFusion SQL that delta-rs reads (predicates, MERGE)."""
    return '"' + name.replace('"', '""') + '"'


def net_upserts(batch: pa.Table, keys: Sequence[str], values: Sequence[str]) -> pa.Table | None:
    """The net change of a batch with no TRUNCATE and no key change, one row per touched key:
    the key columns, each value column (its latest sent value), ``sent_column(i)`` (whether the
    ``i``-th value was sent at all), ``_FILL`` (no INSERT of the key in the batch: unsent
    columns keep the target's value) and ``DELETE_COLUMN`` (the key's last change is a delete).
    None when the batch has a TRUNCATE or moves a row to another key."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    op = batch.column(OP)
    if pc.any(pc.equal(op, TRUNCATE)).as_py():
        return None
    old = batch.column(OLD)
    if pc.any(pc.is_valid(old)).as_py():
        for key in keys:
            same = pc.equal(pc.struct_field(old, key), batch.column(key))
            moved = pc.and_(pc.is_valid(old), pc.invert(pc.fill_null(same, False)))
            if pc.any(moved).as_py():
                return None
    # Commit order as indices: only the columns the grouping needs are reordered (a sorted copy
    # of the whole batch cost a third of a first state's time); values are taken once, at the end.
    order = pc.sort_indices(batch.select([COMMIT_LSN, SEQ]),
                            sort_keys=[(COMMIT_LSN, "ascending"), (SEQ, "ascending")])  # fmt: skip
    op = pc.take(batch.column(OP), order)
    rows = batch.num_rows
    position = pa.array(np.arange(rows, dtype=np.int64))
    carries = pc.is_in(op, pa.array([INSERT, UPDATE])).to_numpy(zero_copy_only=False)
    unchanged = pc.take(batch.column(UNCHANGED), order)
    names = pc.list_flatten(unchanged)
    owners = pc.list_parent_indices(unchanged).to_numpy(zero_copy_only=False)
    work: dict[str, Any] = {key: pc.take(batch.column(key), order) for key in keys}
    work[f"{INTERNAL}pos"] = position
    work[f"{INTERNAL}ins"] = pc.equal(op, INSERT)
    for i, name in enumerate(values):
        sent = carries.copy()
        if len(names):
            hits = pc.equal(names, name).to_numpy(zero_copy_only=False)
            sent[owners[hits]] = False
        work[f"{INTERNAL}sp{i}"] = pa.array(np.where(sent, np.arange(rows), -1), pa.int64())
    grouped = (
        pa.table(work)
        .group_by(list(keys), use_threads=False)
        .aggregate(
            [(f"{INTERNAL}pos", "max"), (f"{INTERNAL}ins", "any")]
            + [(f"{INTERNAL}sp{i}", "max") for i in range(len(values))]
        )
    )
    out: dict[str, Any] = {key: grouped.column(key) for key in keys}
    last = grouped.column(f"{INTERNAL}pos_max")
    out[DELETE_COLUMN] = pc.equal(pc.take(op, last), DELETE)
    out[_FILL] = pc.invert(grouped.column(f"{INTERNAL}ins_any"))
    for i, name in enumerate(values):
        at = grouped.column(f"{INTERNAL}sp{i}_max")
        valid = pc.greater_equal(at, 0)
        sorted_at = pc.if_else(valid, at, pa.scalar(None, pa.int64()))
        out[name] = pc.take(batch.column(name), pc.take(order, sorted_at))
        out[sent_column(i)] = valid
    return pa.table(out)


def updates_of_missing_rows(
    target: Any | None, net: pa.Table, keys: Sequence[str], values: Sequence[str]
) -> list[Any] | None:
    """The keys of net upserts that must keep target values (an unchanged TOAST value, no
    INSERT in the batch) but have no target row (``target`` None: no state yet): Spark's path
    fails there rather than insert NULLs. None: such rows exist and their keys cannot be looked
    up here (not integer or text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not values:
        return []
    from functools import reduce

    complete = reduce(pc.and_, [net.column(sent_column(i)) for i in range(len(values))])
    needs = pc.and_(
        pc.invert(net.column(DELETE_COLUMN)), pc.and_(net.column(_FILL), pc.invert(complete))
    )
    asked = net.filter(needs).select(list(keys))
    if asked.num_rows == 0:
        return []
    if target is None:  # no state: no such row is anywhere
        return [row if len(keys) > 1 else row[keys[0]] for row in asked.slice(0, 1).to_pylist()]
    if len(keys) != 1 or not (
        pa.types.is_integer(asked.schema[0].type) or pa.types.is_string(asked.schema[0].type)
    ):
        return None
    key = keys[0]
    wanted = asked.column(0).to_pylist()
    present: set[Any] = set()
    # a DataFusion predicate over the state (no PostgreSQL): the name is quoted, each value is
    # an integer or a text literal with its quotes doubled. In lists of IN_LIST_KEYS: DataFusion
    # parses a longer list recursively, and at about 21,000 keys it overflows the stack and the
    # process dies by SIGSEGV, with no error to report
    for first in range(0, len(wanted), IN_LIST_KEYS):
        literals = ", ".join(
            str(int(v)) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"
            for v in wanted[first : first + IN_LIST_KEYS]
        )
        found = target.scan(columns=[key], predicate=f"{quote(key)} IN ({literals})")
        present.update(pa.table(found).column(0).to_pylist())
    return [v for v in wanted if v not in present]
