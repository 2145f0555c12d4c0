"""The versions of a table under REPLICA IDENTITY FULL: a multiset of copies of rows.

Such a table has no key: PostgreSQL sends the whole old row of each update and delete, and two
equal rows are copies nobody can tell apart. So an update or delete ends one current version
equal to its old row: the oldest (the history's first versions, begun from a state, before
every other), which any reader's answer is the same for, and which makes the history the same
whichever run writes it. A TRUNCATE ends every current version. Reduced in a plain loop, in
commit order: such tables are rarely big, and a copy's match depends on every change before it.
"""

from __future__ import annotations

from collections import deque
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    COMMIT_TS,
    DELETE,
    INSERT,
    OLD,
    OP,
    SEQ,
    TRUNCATE,
    UNCHANGED,
    UPDATE,
)
from airflow_pglogrepl.changelog.history_columns import DELETE as ENDED_DELETE
from airflow_pglogrepl.changelog.history_columns import RESYNC as ENDED_RESYNC
from airflow_pglogrepl.changelog.history_columns import TRUNCATE as ENDED_TRUNCATE
from airflow_pglogrepl.changelog.history_columns import UPDATE as ENDED_UPDATE
from airflow_pglogrepl.changelog.history_columns import (
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    history_fields,
)
from airflow_pglogrepl.merge.history_versions import (
    RESYNC_OP,
    Prior,
    Versions,
    history_field,
    with_ending,
)

if TYPE_CHECKING:
    import pyarrow as pa


def copies_versions(batch: pa.Table, columns: list[str], prior: Prior,
                    types: pa.Schema) -> Versions:  # fmt: skip
    """REPLICA IDENTITY FULL: rows are their values, equal rows are copies. An update or delete
    ends the oldest current version equal to its old row; a TRUNCATE (or a resync) ends every
    one."""
    import pyarrow.compute as pc

    batch = batch.sort_by([(COMMIT_LSN, "ascending"), (SEQ, "ascending")])
    ops = batch.column(OP).to_pylist()
    if all(op == INSERT for op in ops):
        earlier: pa.Table | None = None  # inserts end nothing: the history is not read
    else:
        every = prior(None)  # oldest first: a history's first versions (NULL) first of all
        earlier = every.take(pc.sort_indices(every, sort_keys=[
            (VALID_FROM_LSN, "ascending", "at_start"), (VALID_FROM_SEQ, "ascending", "at_start"),
        ]))  # fmt: skip
    open_by_value: dict[tuple[Any, ...], deque[int]] = {}
    values: list[tuple[Any, ...]] = []  # of opened versions
    ends: dict[int, tuple[int, str]] = {}  # opened version -> (row that ended it, why)
    prior_ends: dict[int, tuple[int, str]] = {}  # prior row -> (row, why)
    if earlier is not None:
        for index, row in enumerate(earlier.select(columns).to_pylist()):
            open_by_value.setdefault(_key(row.values()), deque()).append(-1 - index)
    news = batch.select(columns).to_pylist()
    olds = batch.column(OLD).to_pylist()
    unchanged = batch.column(UNCHANGED).to_pylist()
    orphans = 0

    def end(value: tuple[Any, ...], row: int, why: str) -> None:
        nonlocal orphans
        copies = open_by_value.get(value)
        if not copies:
            orphans += 1
            return
        version = copies.popleft()
        (ends if version >= 0 else prior_ends)[version if version >= 0 else -1 - version] = (
            row, why)  # fmt: skip

    opened_rows: list[int] = []
    for row, op in enumerate(ops):
        if op in (TRUNCATE, RESYNC_OP):
            why = ENDED_TRUNCATE if op == TRUNCATE else ENDED_RESYNC
            for copies in open_by_value.values():
                for version in copies:
                    target = ends if version >= 0 else prior_ends
                    target[version if version >= 0 else -1 - version] = (row, why)
            open_by_value.clear()
            continue
        new = news[row]
        if op in (UPDATE, DELETE):
            old = olds[row] if op == UPDATE and olds[row] is not None else new
            old_value = _key(old[c] for c in columns)
            end(old_value, row, ENDED_DELETE if op == DELETE else ENDED_UPDATE)
            for column in unchanged[row] or ():
                new[column] = old[column]
        if op in (INSERT, UPDATE):
            value = tuple(new[c] for c in columns)
            open_by_value.setdefault(_key(value), deque()).append(len(values))
            values.append(value)
            opened_rows.append(row)
    return _multiset_result(batch, columns, types, values, opened_rows, ends, earlier,
                            prior_ends, orphans)  # fmt: skip


def _multiset_result(batch: pa.Table, columns: list[str], types: pa.Schema,
                     values: list[tuple[Any, ...]], opened_rows: list[int],
                     ends: dict[int, tuple[int, str]], earlier: pa.Table | None,
                     prior_ends: dict[int, tuple[int, str]], orphans: int) -> Versions:  # fmt: skip
    import numpy as np
    import pyarrow as pa

    table_types = pa.schema([types.field(c) for c in columns])
    rows = pa.Table.from_pylist([dict(zip(columns, v, strict=True)) for v in values],
                                schema=table_types)  # fmt: skip
    end_row = np.array([ends.get(i, (-1, ""))[0] for i in range(len(values))], dtype=np.int64)
    ended = np.array([ends[i][1] if i in ends else None for i in range(len(values))],
                     dtype=object)  # fmt: skip
    lsn = batch.column(COMMIT_LSN).to_numpy(zero_copy_only=False)
    seq = batch.column(SEQ).to_numpy(zero_copy_only=False)
    opened_at = np.asarray(opened_rows, dtype=np.int64)
    current = end_row < 0
    stamps = batch.column(COMMIT_TS)
    arrays = [
        pa.array(lsn[opened_at] if len(opened_at) else np.zeros(0, np.int64)),
        pa.array(seq[opened_at] if len(opened_at) else np.zeros(0, np.int64)),
        stamps.take(pa.array(opened_at, type=pa.int64())),
        pa.array(lsn.take(end_row, mode="clip") if len(end_row) else end_row, mask=current),
        pa.array(seq.take(end_row, mode="clip") if len(end_row) else end_row, mask=current),
        stamps.take(pa.array(end_row, mask=current, type=pa.int64())),
        pa.array(current, type=pa.bool_()),
        pa.array(ended, type=pa.string()),
    ]
    opened = rows
    for field, array in zip(history_fields(), arrays, strict=True):
        opened = opened.append_column(field, array.cast(field.type))
    match = (VALID_FROM_LSN, VALID_FROM_SEQ)
    chosen = sorted(prior_ends)
    base = (earlier.select(list(match)).take(pa.array(chosen, type=pa.int64()))
            if earlier is not None else
            pa.schema([history_field(m) for m in match]).empty_table())  # fmt: skip
    closed = with_ending(base, batch, np.array([prior_ends[i][0] for i in chosen],
                                                dtype=np.int64),
                          [prior_ends[i][1] for i in chosen])  # fmt: skip
    return Versions(opened, closed, match, orphans)


_NAN = ("NaN",)  # a NaN is equal to itself here, as PostgreSQL's float and numeric compare it


def _key(values: Any) -> tuple[Any, ...]:
    """Values as one hashable key that is equal where PostgreSQL's row values are: lists and
    structs (arrays, intervals, ranges) as tuples, NaN as one value."""
    return tuple(_canonical(v) for v in values)


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return _NAN
    if isinstance(value, Decimal) and value.is_nan():
        return _NAN
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    return value
