"""Decoded changes of one table, gathered column by column into a typed Arrow table.

The drain fills one ``ChangelogBatch`` per table (per version of its description: a Relation
message after DDL starts a new batch) and hands full batches to Spark, so the driver holds at
most ``batch_rows`` rows per table whatever the size of the window or of a transaction.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.changelog.types import arrow_value
from airflow_pglogrepl.exceptions import UnstorableValueError
from airflow_pglogrepl.pgoutput.values import OID
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.pgoutput import Change, TableInfo


class ChangelogBatch:
    """Rows of one table version, with the changelog's metadata columns.

    Kept as one tuple of values per row (``operator.itemgetter`` on the decoded dict) and one
    entry per transaction for the transaction's columns; ``to_arrow`` transposes them into
    columns.
    """

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self.ref = TableRef(table.schema, table.table)
        self._names = table.names
        self._types = tuple((c.value_type_oid, c.type_modifier) for c in table.columns)
        self._nulls: tuple[None, ...] = (None,) * len(self._names)
        self._getter = _row_getter(self._names)
        self._rows: list[tuple[Any, ...]] = []
        self._old: list[dict[str, Any] | None] = []
        self._op: list[str] = []
        self._seq: list[int] = []
        self._unchanged: list[list[str] | None] = []
        # the transaction's columns, once per run of changes from the same transaction
        self._run_first: list[int] = []  # index of the run's first change
        self._run_xid: list[int] = []
        self._run_lsn: list[int] = []  # commit LSN as an integer (0 when unknown)
        self._run_ts: list[Any] = []
        self._run_txn: object = None

    def __len__(self) -> int:
        return len(self._op)

    def add(self, change: Change, seq: int) -> None:
        """Append one change; ``seq`` is its order in the transaction across all tables."""
        op = change.op
        old = None
        unchanged = None
        if op == cl.INSERT:
            row = change.new
        elif op == cl.UPDATE:
            row = change.new
            toast = change.unchanged_toast
            if toast:
                unchanged = sorted(toast)
            old = change.old
        elif op == cl.DELETE:
            row = change.old
        else:
            row = None
        if not row:
            values = self._nulls
        elif len(row) == len(self._nulls):  # every column present: one C call
            try:
                values = self._getter(row)
            except KeyError:  # not the table's names after all
                values = tuple([row.get(name) for name in self._names])
        else:  # unchanged TOAST columns, or a DELETE's old key
            values = tuple([row.get(name) for name in self._names])
        transaction = change.transaction
        if transaction is not self._run_txn:
            commit_lsn = change.commit_lsn
            self._run_first.append(len(self._op))
            self._run_xid.append(change.xid)
            self._run_lsn.append(int(commit_lsn) if commit_lsn is not None else 0)
            self._run_ts.append(change.commit_ts)
            self._run_txn = transaction
        self._rows.append(values)
        self._old.append(old)
        self._unchanged.append(unchanged)
        self._op.append(op)
        self._seq.append(seq)

    def schema(self) -> pa.Schema:
        """The table's changelog schema (``columns.changelog_schema``)."""
        return cl.changelog_schema(self.table)

    def to_arrow(self) -> pa.Table:
        """The gathered rows as one Arrow table (then the batch can be dropped)."""
        import pyarrow as pa

        schema = self.schema()
        count = len(self._op)
        columns: list[Sequence[Any]] = (
            list(zip(*self._rows, strict=True)) if count else [() for _ in self._names]
        )
        arrays = [
            self._column(values, oid, mod, field)
            for values, (oid, mod), field in zip(columns, self._types, schema, strict=False)
        ]
        # the transaction's columns: each run's value, taken once for each of its changes
        run_of: list[int] = []
        ends = [*self._run_first[1:], count]
        for index, (first, end) in enumerate(zip(self._run_first, ends, strict=False)):
            run_of += [index] * (end - first)
        runs = pa.array(run_of, pa.int64())
        return assemble(
            schema,
            arrays,
            op=pa.array(self._op, pa.string()),
            lsn=pa.array(self._run_lsn, pa.int64()).take(runs),
            seq=pa.array(self._seq, pa.int64()),
            xid=pa.array(self._run_xid, pa.int64()).take(runs),
            ts=pa.array(self._run_ts, pa.timestamp("us", tz="UTC")).take(runs),
            unchanged=pa.array(self._unchanged, pa.list_(pa.string())),
            old=self._old_array(cl.old_type(schema)),
        )

    def _column(
        self, values: Sequence[Any], oid: int | None, modifier: int, field: pa.Field
    ) -> pa.Array:
        try:
            return _arrow_column(values, oid, modifier, field.type)
        except ValueError:
            error = self._unstorable(field.name, values, oid, modifier)
            if error is None:
                raise
            raise error from None

    def _unstorable(
        self, name: str, values: Sequence[Any], oid: int | None, modifier: int
    ) -> UnstorableValueError | None:
        """The error naming the first value of a column that its lake type cannot hold."""
        for value in values:
            try:
                _convert(value, oid, modifier)
            except ValueError as exc:
                return UnstorableValueError(str(self.ref), name, value, str(exc))
        return None

    def _old_array(self, old_type: pa.DataType) -> pa.Array:
        import pyarrow as pa

        if all(_as_is(oid) for oid, _ in self._types):
            try:  # missing keys (an old key's other columns) become NULL, as .get() gave
                return pa.array(self._old, old_type)
            except _ARROW_REFUSED:
                pass  # the exact conversion below raises the error the caller should see
        try:
            olds = [
                None
                if old is None
                else {
                    name: _convert(old.get(name), oid, mod)
                    for name, (oid, mod) in zip(self._names, self._types, strict=True)
                }
                for old in self._old
            ]
        except ValueError:
            for name, (oid, mod) in zip(self._names, self._types, strict=True):
                column = [old.get(name) for old in self._old if old is not None]
                error = self._unstorable(f"{cl.OLD}.{name}", column, oid, mod)
                if error is not None:
                    raise error from None
            raise
        return pa.array(olds, old_type)


def assemble(
    schema: pa.Schema,
    columns: Sequence[pa.Array],
    *,
    op: pa.Array,
    lsn: pa.Array,
    seq: pa.Array,
    xid: pa.Array,
    ts: pa.Array,
    unchanged: pa.Array | None,
    old: pa.Array | None,
) -> pa.Table:
    """One changelog table of ``schema`` (``columns.changelog_schema``): the table's
    ``columns``, then the metadata columns in the contract's order, from ready arrays.

    ``ts`` may be ``int64`` microseconds since 1970 (UTC): it is cast to the commit time's type.
    ``unchanged`` or ``old`` None: NULL in every row.
    """
    import pyarrow as pa

    count = len(op)
    stamp = schema.field(len(columns) + cl.META_COLUMNS.index(cl.COMMIT_TS)).type
    if ts.type != stamp:
        ts = ts.cast(stamp)
    if unchanged is None:
        unchanged = pa.nulls(count, pa.list_(pa.string()))
    if old is None:
        old = pa.nulls(count, cl.old_type(schema))
    arrays = [*columns, op, lsn, seq, xid, ts, unchanged, old]
    return pa.Table.from_arrays(arrays, schema=schema)


def truncate_row(table: TableInfo, lsn: int, seq: int, xid: int, ts_us: int) -> pa.Table:
    """The changelog row of a Truncate of ``table``: every table column NULL. ``lsn`` is the
    transaction's commit LSN, ``ts_us`` its commit time in microseconds since 1970 (UTC)."""
    import pyarrow as pa

    schema = cl.changelog_schema(table)
    return assemble(
        schema,
        [pa.nulls(1, schema.field(k).type) for k in range(len(table.names))],
        op=pa.array([cl.TRUNCATE], pa.string()),
        lsn=pa.array([lsn], pa.int64()),
        seq=pa.array([seq], pa.int64()),
        xid=pa.array([xid], pa.int64()),
        ts=pa.array([ts_us], pa.int64()),
        unchanged=None,
        old=None,
    )


def _convert(value: Any, oid: int | None, modifier: int) -> Any:
    return None if value is None else arrow_value(value, oid, modifier)


def _row_getter(names: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``row -> tuple of its values in column order`` for a dict holding every column."""
    if len(names) >= 2:
        return operator.itemgetter(*names)  # a tuple for two names or more
    return lambda row: tuple([row[name] for name in names])


# Types whose decoded values arrow_value returns unchanged: plain int, float, bool, bytes, str,
# date and naive datetime objects (Interval, UUID and IP objects, which it converts, only
# come from their own types). Their columns go to pyarrow as they are; should a value surprise
# pyarrow, the column takes the exact per-value path, which converts or raises as it always did.
_AS_IS_OIDS = frozenset(
    {
        OID.BOOL, OID.BYTEA, OID.NAME, OID.INT8, OID.INT2, OID.INT4, OID.TEXT, OID.FLOAT4,
        OID.FLOAT8, OID.BPCHAR, OID.VARCHAR, OID.DATE, OID.TIMESTAMP, OID.JSON, OID.JSONB,
    }
)  # fmt: skip


# what pyarrow raises for a value it cannot take (ArrowInvalid and ArrowTypeError among them)
_ARROW_REFUSED = (TypeError, ValueError, ArithmeticError, NotImplementedError)


def _as_is(oid: int | None) -> bool:
    return oid in _AS_IS_OIDS


def _arrow_column(
    values: Sequence[Any], oid: int | None, modifier: int, arrow_type: pa.DataType
) -> pa.Array:
    """One table column as an Arrow array, as ``arrow_value`` on every value would give it."""
    import pyarrow as pa

    try:
        if oid in _AS_IS_OIDS:
            return pa.array(values, type=arrow_type)
        if oid == OID.TIMESTAMPTZ:  # arrow_value's conversion, without its other checks
            return pa.array(
                [None if v is None else v.astimezone(dt.UTC) for v in values], type=arrow_type
            )
    except (*_ARROW_REFUSED, AttributeError):
        pass  # something arrow_value converts or refuses: the exact path below says which
    return pa.array([_convert(v, oid, modifier) for v in values], type=arrow_type)
