"""Decoded changes of one table, gathered column by column into a typed Arrow table.

The drain fills one ``ChangelogBatch`` per table (per version of its description: a Relation
message after DDL starts a new batch) and hands full batches to Spark, so the driver holds at
most ``batch_rows`` rows per table whatever the size of the window or of a transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.pgoutput.schema import arrow_value
from airflow_pglogrepl.spark import changelog as cl
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.pgoutput import Change, TableInfo


class ChangelogBatch:
    """Rows of one table version, as column lists, with the changelog's metadata columns."""

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self.ref = TableRef(table.schema, table.table)
        self._names = table.names
        self._types = tuple((c.value_type_oid, c.type_modifier) for c in table.columns)
        self._values: list[list[Any]] = [[] for _ in self._names]
        self._old: list[dict[str, Any] | None] = []
        self._op: list[str] = []
        self._lsn: list[int] = []
        self._seq: list[int] = []
        self._xid: list[int] = []
        self._ts: list[Any] = []
        self._unchanged: list[list[str] | None] = []

    def __len__(self) -> int:
        return len(self._op)

    def add(self, change: Change, seq: int) -> None:
        """Append one change; ``seq`` is its order in the transaction across all tables."""
        op = change.op
        if op == cl.INSERT or op == cl.UPDATE:
            row = change.new or {}
        elif op == cl.DELETE:
            row = change.old or {}
        else:
            row = {}
        for values, name in zip(self._values, self._names, strict=True):
            values.append(row.get(name))
        unchanged = change.unchanged_toast if op == cl.UPDATE else None
        self._unchanged.append(sorted(unchanged) if unchanged else None)
        self._old.append(change.old if op == cl.UPDATE else None)
        self._op.append(op)
        commit_lsn = change.commit_lsn
        self._lsn.append(int(commit_lsn) if commit_lsn is not None else 0)
        self._seq.append(seq)
        self._xid.append(change.xid)
        self._ts.append(change.commit_ts)

    def schema(self) -> pa.Schema:
        """The table's columns (typed by the decoder's mapping) plus the metadata columns."""
        import pyarrow as pa

        base = self.table.arrow_schema()
        return pa.schema(
            [
                *base,
                pa.field(cl.OP, pa.string(), nullable=False),
                pa.field(cl.COMMIT_LSN, pa.int64(), nullable=False),
                pa.field(cl.SEQ, pa.int64(), nullable=False),
                pa.field(cl.XID, pa.int64(), nullable=False),
                pa.field(cl.COMMIT_TS, pa.timestamp("us", tz="UTC")),
                pa.field(cl.UNCHANGED, pa.list_(pa.string())),
                pa.field(cl.OLD, pa.struct(list(base))),
            ]
        )

    def to_arrow(self) -> pa.Table:
        """The gathered rows as one Arrow table (then the batch can be dropped)."""
        import pyarrow as pa

        schema = self.schema()
        arrays = [
            pa.array([_convert(v, oid, mod) for v in values], type=field.type)
            for values, (oid, mod), field in zip(self._values, self._types, schema, strict=False)
        ]
        old_type = schema.field(cl.OLD).type
        olds = [
            None
            if old is None
            else {
                name: _convert(old.get(name), oid, mod)
                for name, (oid, mod) in zip(self._names, self._types, strict=True)
            }
            for old in self._old
        ]
        arrays += [
            pa.array(self._op, pa.string()),
            pa.array(self._lsn, pa.int64()),
            pa.array(self._seq, pa.int64()),
            pa.array(self._xid, pa.int64()),
            pa.array(self._ts, pa.timestamp("us", tz="UTC")),
            pa.array(self._unchanged, pa.list_(pa.string())),
            pa.array(olds, old_type),
        ]
        return pa.Table.from_arrays(arrays, schema=schema)

    def describe(self) -> dict[str, Any]:
        """What the commit record keeps about the table: names, key, identity."""
        return {
            "schema": self.table.schema,
            "table": self.table.table,
            "columns": list(self._names),
            "key": list(self.table.key_names),
            "replica_identity": self.table.replica_identity,
        }


def _convert(value: Any, oid: int | None, modifier: int) -> Any:
    return None if value is None else arrow_value(value, oid, modifier)
