"""A batch of changes as versions of rows: the reduction behind ``history/`` (no storage here).

Each change that writes a row (insert, update) opens a version; each change that ends a row
(update, delete, an update to another key, TRUNCATE) closes the version before it. What a batch
gives the history is two sets: the versions it opens (``Versions.opened``, closed already when
a later change in the batch ended them) and the versions of earlier batches it closes
(``Versions.closed``). Applying both is one Delta commit.

A keyed table (primary key or unique index as replica identity) is reduced vectorised: events
sorted by key and position, each version ended by the next event of its key or the next
TRUNCATE, whichever comes first. An update that leaves a TOASTed column unchanged takes its value
from the version it ends, following the chain through the batch back to the history's current
version where it must (``prior``: read only then). A table without a key and without a replica
identity only ever gets inserts and truncates. Under REPLICA IDENTITY FULL the table is a
multiset of copies (``merge.history_copies``).

A change that ends a version the history does not hold (its row is nowhere: history turned on
after the row was made, without a state to begin from) ends nothing: where the batch shows it (a
row its own TRUNCATE or delete ended) it is counted in ``Versions.orphans``; a first change of a
key is sent to the MERGE, where it matches nothing (``merge.history`` counts those). An update
that keeps a TOAST value of such a row cannot be written and raises ``MissingVersionError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
from airflow_pglogrepl.changelog.history_columns import (
    DELETE as ENDED_DELETE,
)
from airflow_pglogrepl.changelog.history_columns import (
    ENDED_BY,
    IS_CURRENT,
    KEY_CHANGE,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO,
    VALID_TO_LSN,
    VALID_TO_SEQ,
    history_fields,
)
from airflow_pglogrepl.changelog.history_columns import (
    RESYNC as ENDED_RESYNC,
)
from airflow_pglogrepl.changelog.history_columns import (
    TRUNCATE as ENDED_TRUNCATE,
)
from airflow_pglogrepl.changelog.history_columns import (
    UPDATE as ENDED_UPDATE,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# Not a changelog operation: the table copied from the source again at this point (a
# re-snapshot, a backfill): every current version ends, the copy's rows follow as inserts.
RESYNC_OP = "S"
# The history's current versions of the given keys (a table of key columns), or all of them
# (None): the table's columns and the history columns.
Prior = Callable[["pa.Table | None"], "pa.Table"]


class MissingVersionError(ValueError):
    """An update keeps a TOAST value of a row the history has no version of: its value is
    nowhere to be taken from."""

    def __init__(self, key: dict[str, Any]) -> None:
        super().__init__(f"an update keeps an unchanged TOAST value of row {key}, which the "
                         "history holds no version of")  # fmt: skip
        self.key = key


@dataclass(frozen=True)
class Versions:
    """What a batch does to a history: versions it opens (with their ends when the batch ended
    them too) and earlier versions it closes, matched by ``match`` (the key; for a table
    without one, the version's ``_valid_from_lsn`` and ``_valid_from_seq``)."""

    opened: pa.Table  # the table's columns, then the history columns
    closed: pa.Table  # ``match`` columns, then the ending columns
    match: tuple[str, ...]
    orphans: int = 0  # changes that ended a version the history does not hold


def versions(batch: pa.Table, columns: Sequence[str], keys: Sequence[str], *, prior: Prior,
             types: pa.Schema) -> Versions:  # fmt: skip
    """The versions a batch of changelog rows makes (any order: sorted here by ``(_commit_lsn,
    _seq)``), for a keyed table or one with no replica identity (REPLICA IDENTITY FULL:
    ``merge.history_copies``). ``types`` holds the table's columns as the history stores them."""
    import pyarrow.compute as pc

    batch = batch.sort_by([(COMMIT_LSN, "ascending"), (SEQ, "ascending")])
    if not keys:
        ops = set(pc.unique(batch.column(OP)).to_pylist())
        if ops - {INSERT, TRUNCATE, RESYNC_OP}:
            raise ValueError(f"a table without a replica identity has changes {sorted(ops)}")
    return _Keyed(batch, list(columns), list(keys), prior, types).versions()


class _Keyed:
    """The vectorised reduction of a keyed table's batch (or of a table with no identity,
    whose every insert is a row of its own)."""

    def __init__(self, batch: pa.Table, columns: list[str], keys: list[str], prior: Prior,
                 types: pa.Schema) -> None:  # fmt: skip
        import numpy as np

        self.batch, self.columns, self.keys, self.prior, self.types = (
            batch, columns, keys, prior, types)  # fmt: skip
        op = batch.column(OP).to_numpy(zero_copy_only=False)
        self.lsn = batch.column(COMMIT_LSN).to_numpy(zero_copy_only=False)
        self.seq = batch.column(SEQ).to_numpy(zero_copy_only=False)
        rows = np.arange(batch.num_rows)
        updates, deletes = op == UPDATE, op == DELETE
        self.close_rows = rows[updates | deletes]
        self.open_rows = rows[(op == INSERT) | updates]
        ends_all = (op == TRUNCATE) | (op == RESYNC_OP)
        self.truncate_rows = rows[ends_all]
        self.truncate_why = np.where(op[ends_all] == RESYNC_OP, ENDED_RESYNC, ENDED_TRUNCATE)
        self.ended_by = np.where(deletes, ENDED_DELETE, ENDED_UPDATE).astype(object)
        if keys:
            old, moved = self._old_keys(updates)
            self.ended_by[moved] = KEY_CHANGE
            self.close_keys = old.take(self.close_rows)
            self.open_keys = batch.select(keys).take(self.open_rows)
            ids = _dense_ids([self.close_keys, self.open_keys], keys)
            self.close_ids, self.open_ids = ids[0], ids[1]
        else:
            self.close_keys = batch.select([]).take(self.close_rows)
            self.close_ids = np.zeros(0, dtype=np.int64)
            self.open_ids = np.arange(len(self.open_rows), dtype=np.int64)

    def _old_keys(self, updates: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Each row's old key (an update's ``_old`` key fields when PostgreSQL sent them, else
        its key) and which updates moved their row to another key."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        old = self.batch.column(OLD)
        sent = pc.is_valid(old)
        arrays, moved = [], np.zeros(self.batch.num_rows, dtype=bool)
        for key in self.keys:
            new = self.batch.column(key)
            before = pc.if_else(sent, pc.struct_field(old, key), new)
            arrays.append(before)
            differs = pc.fill_null(pc.not_equal(before, new), True)
            moved |= differs.to_numpy(zero_copy_only=False)
        return pa.table(arrays, names=self.keys), moved & updates

    def versions(self) -> Versions:
        import numpy as np

        n_close, n_open = len(self.close_rows), len(self.open_rows)
        pos = np.concatenate([2 * self.close_rows, 2 * self.open_rows + 1])
        kid = np.concatenate([self.close_ids, self.open_ids])
        is_open = np.concatenate([np.zeros(n_close, bool), np.ones(n_open, bool)])
        truncates = 2 * self.truncate_rows
        epoch = np.searchsorted(truncates, pos)
        order = np.lexsort((pos, kid))
        s_kid, s_epoch, s_open = kid[order], epoch[order], is_open[order]
        total = len(order)
        same_next = np.zeros(total, bool)
        same_next[:-1] = (s_kid[1:] == s_kid[:-1]) & (s_epoch[1:] == s_epoch[:-1])
        first_of_key = np.ones(total, bool)
        first_of_key[1:] = s_kid[1:] != s_kid[:-1]
        where = np.empty(total, dtype=np.int64)
        where[order] = np.arange(total)
        # an open ends at the next event of its key (a close) or the next TRUNCATE
        end_row = np.full(n_open, -1, dtype=np.int64)
        ended = np.empty(n_open, dtype=object)
        at = where[n_close:]
        nxt = np.minimum(at + 1, total - 1)
        by_close = same_next[at] & ~s_open[nxt]
        closer = order[nxt]  # (a close's event index is its index among the closes)
        end_row[by_close] = self.close_rows[closer[by_close]]
        ended[by_close] = self.ended_by[end_row[by_close]]
        open_epoch = epoch[n_close:]
        by_truncate = ~by_close & (open_epoch < len(truncates))
        end_row[by_truncate] = self.truncate_rows[open_epoch[by_truncate]]
        ended[by_truncate] = self.truncate_why[open_epoch[by_truncate]]
        # a close ends the open before it, or the history's current version (its key's first
        # event, before any TRUNCATE), or nothing the history holds
        cat = where[:n_close]
        prev = np.maximum(cat - 1, 0)
        after_open = (cat > 0) & same_next[prev] & s_open[prev]
        close_pred = np.where(after_open, order[prev] - n_close, -1)
        to_prior = ~after_open & first_of_key[cat] & (epoch[:n_close] == 0)
        orphans = int(np.count_nonzero(~after_open & ~to_prior))
        opened = self._opened(end_row, ended, close_pred, to_prior)
        closed = self._closed(to_prior)
        match = tuple(self.keys) or (VALID_FROM_LSN, VALID_FROM_SEQ)
        return Versions(opened, closed, match, orphans)

    def _opened(self, end_row: np.ndarray, ended: np.ndarray, close_pred: np.ndarray,
                to_prior: np.ndarray) -> pa.Table:  # fmt: skip
        """The versions opened, with the unchanged TOAST values carried into them."""
        import pyarrow as pa

        rows = self.batch.take(self.open_rows).select(self.columns)
        rows = rows.cast(pa.schema([self.types.field(c) for c in self.columns]))
        rows = self._carried(rows, close_pred, to_prior)
        stamps = self.batch.column(COMMIT_TS)
        current = end_row < 0
        taken = pa.array(end_row, mask=current)
        arrays = [
            pa.array(self.lsn[self.open_rows]),
            pa.array(self.seq[self.open_rows]),
            stamps.take(pa.array(self.open_rows)),
            pa.array(self.lsn.take(end_row, mode="clip"), mask=current),
            pa.array(self.seq.take(end_row, mode="clip"), mask=current),
            stamps.take(taken),
            pa.array(current),
            pa.array(ended, type=pa.string()),
        ]
        out = rows
        for field, array in zip(history_fields(), arrays, strict=True):
            out = out.append_column(field, array.cast(field.type))
        return out

    def _carried(self, rows: pa.Table, close_pred: np.ndarray, to_prior: np.ndarray) -> pa.Table:
        """``rows`` (the opened versions) with each unchanged TOAST value taken from the version
        its update ended, through the batch and, where the chain starts before it, the
        history's current version."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        unchanged = self.batch.column(UNCHANGED).combine_chunks()
        if pc.sum(pc.list_value_length(unchanged)).as_py() in (None, 0):
            return rows
        n_open = len(self.open_rows)
        open_of_row = np.full(self.batch.num_rows, -1, dtype=np.int64)
        open_of_row[self.open_rows] = np.arange(n_open)
        close_of_row = np.full(self.batch.num_rows, -1, dtype=np.int64)
        close_of_row[self.close_rows] = np.arange(len(self.close_rows))
        # the version each opened one follows: an open (index), the prior (n_open + its row
        # there) or none (-1)
        pred = np.full(n_open, -1, dtype=np.int64)
        from_update = close_of_row[self.open_rows]
        has = from_update >= 0
        pred[has] = close_pred[from_update[has]]
        prior_rows, prior = self._prior_for(from_update, has & (pred < 0), to_prior)
        pred[prior_rows >= 0] = n_open + prior_rows[prior_rows >= 0]
        flat = pc.list_flatten(unchanged).to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(unchanged).to_numpy(zero_copy_only=False)
        for column in self.columns:
            kept = open_of_row[parents[flat == column]]
            if len(kept) == 0:
                continue
            mask = np.zeros(n_open, bool)
            mask[kept[kept >= 0]] = True
            source = _follow(pred, mask, n_open)
            if np.any(source[mask] < 0):
                first = int(np.flatnonzero(mask & (source < 0))[0])
                key = rows.select(self.keys).slice(first, 1).to_pylist()[0]
                raise MissingVersionError(key)
            values = pa.concat_arrays([
                rows.column(column).combine_chunks(),
                prior.column(column).cast(rows.schema.field(column).type).combine_chunks(),
            ])  # fmt: skip
            index = rows.schema.get_field_index(column)
            rows = rows.set_column(index, rows.schema.field(index), values.take(pa.array(source)))
        return rows

    def _prior_for(self, from_update: np.ndarray, wanted: np.ndarray,
                   to_prior: np.ndarray) -> tuple[np.ndarray, pa.Table]:  # fmt: skip
        """For each opened version whose update ended a version of an earlier batch: that
        version's row in the history's current versions (-1: none there, or not needed)."""
        import numpy as np

        found = np.full(len(from_update), -1, dtype=np.int64)
        empty = self.types.empty_table()
        if not wanted.any() or not self.keys:
            return found, empty
        closes = np.where(wanted, from_update, 0)
        wanted = wanted & to_prior[closes]
        if not wanted.any():
            return found, empty
        keys = self.close_keys.take(closes[wanted])
        prior = self.prior(keys)
        if prior.num_rows == 0:
            return found, empty
        ids = _dense_ids([keys, prior.select(self.keys)], self.keys)
        where = {int(k): i for i, k in enumerate(ids[1])}
        found[np.flatnonzero(wanted)] = [where.get(int(k), -1) for k in ids[0]]
        return found, prior

    def _closed(self, to_prior: np.ndarray) -> pa.Table:
        """The versions of earlier batches this one ends: at a key's first close, or, for every
        other current version, at the batch's first TRUNCATE."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = self.close_rows[to_prior]
        keys = self.close_keys.filter(pa.array(to_prior)) if self.keys else None
        ends = list(rows)
        ended = list(self.ended_by[rows])
        if len(self.truncate_rows):
            every = self.prior(None)
            if self.keys and keys is not None and keys.num_rows and every.num_rows:
                ids = _dense_ids([keys, every.select(self.keys)], self.keys)
                left = pc.invert(pc.is_in(pa.array(ids[1]), pa.array(ids[0])))
                every = every.filter(left)
            match = self.keys or [VALID_FROM_LSN, VALID_FROM_SEQ]
            rest = every.select(match)
            keys = rest if keys is None else pa.concat_tables([keys.cast(rest.schema), rest])
            ends += [int(self.truncate_rows[0])] * rest.num_rows
            ended += [str(self.truncate_why[0])] * rest.num_rows
        match = self.keys or [VALID_FROM_LSN, VALID_FROM_SEQ]
        if keys is None:
            keys = pa.schema([self.types.field(k) if k in self.types.names else
                              history_field(k) for k in match]).empty_table()  # fmt: skip
        return with_ending(keys, self.batch, np.asarray(ends, dtype=np.int64), ended)


def history_field(name: str) -> pa.Field:
    return next(f for f in history_fields() if f.name == name)


def with_ending(match: pa.Table, batch: pa.Table, rows: np.ndarray,
                 ended: Sequence[str]) -> pa.Table:  # fmt: skip
    """``match`` with the ending columns of the changes at ``rows`` of ``batch``."""
    import pyarrow as pa

    index = pa.array(rows, type=pa.int64())
    fields = {f.name: f for f in history_fields()}
    arrays = {
        VALID_TO_LSN: batch.column(COMMIT_LSN).take(index),
        VALID_TO_SEQ: batch.column(SEQ).take(index),
        VALID_TO: batch.column(COMMIT_TS).take(index),
        IS_CURRENT: pa.array([False] * len(rows), type=pa.bool_()),
        ENDED_BY: pa.array(list(ended), type=pa.string()),
    }
    out = match
    for name, array in arrays.items():
        out = out.append_column(fields[name], array.cast(fields[name].type))
    return out


def _follow(pred: np.ndarray, mask: np.ndarray, n_open: int) -> np.ndarray:
    """For each opened version, the one whose value it holds: itself unless ``mask`` (its value
    was not sent), else the first unmasked one up its chain of ``pred`` (pointer jumping);
    ``>= n_open`` a prior row, -1 none."""
    import numpy as np

    ptr = np.arange(n_open, dtype=np.int64)
    ptr[mask] = pred[mask]
    while True:
        inner = (ptr >= 0) & (ptr < n_open)
        chase = np.zeros(n_open, bool)
        chase[inner] = mask[ptr[inner]]
        if not chase.any():
            return ptr
        jumped = ptr.copy()
        jumped[chase] = ptr[ptr[chase]]
        ptr = jumped


def _dense_ids(tables: Sequence[pa.Table], keys: Sequence[str]) -> list[np.ndarray]:
    """One id per distinct key across ``tables`` (same key columns): each table's rows' ids."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = [t.num_rows for t in tables]
    first = tables[0].select(list(keys))
    every = pa.concat_tables([first, *(t.select(list(keys)).cast(first.schema)
                                       for t in tables[1:])])  # fmt: skip
    total = every.num_rows
    if total == 0:
        return [np.zeros(0, dtype=np.int64) for _ in tables]
    order = pc.sort_indices(every, sort_keys=[(k, "ascending") for k in keys])
    ordered = every.take(order)
    boundary = np.zeros(total, dtype=bool)
    for key in keys:
        column = ordered.column(key).combine_chunks()
        after, before = column.slice(1), column.slice(0, total - 1)
        differs = pc.fill_null(pc.not_equal(after, before), True)  # one side NULL: differ
        both_null = pc.and_(pc.is_null(after), pc.is_null(before))
        boundary[1:] |= pc.and_not(differs, both_null).to_numpy(zero_copy_only=False)
    ids = np.empty(total, dtype=np.int64)
    ids[order.to_numpy()] = np.cumsum(boundary)
    out, at = [], 0
    for size in sizes:
        out.append(ids[at : at + size])
        at += size
    return out
