"""The columnar decoder's changelog side: the columns ``pgoutput.columnar`` parsed, as one
changelog Arrow table per table description, with no Python object per value on the common path.

A column's values arrive as one ``string`` array gathered from the message buffer, and are cast
to the column's type by ``pyarrow.compute`` where that cast reads PostgreSQL's text exactly as
the reference converters do (integers, floats, booleans, bounded numerics, dates, timestamps;
text-like types need no cast). Other types, and a column whose cast refuses a value
(``infinity``, ``NaN`` in a decimal), go through the reference converters value by value, so
they come out the same (``changelog.types.arrow_from_text_array``). The rows are built by the
changelog's one row builder (``changelog.rows.assemble``), as the per-message path's are. The
property tests hold the two decoders to identical Arrow output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.changelog.rows import assemble, truncate_row
from airflow_pglogrepl.changelog.types import arrow_from_text_array
from airflow_pglogrepl.pgoutput import layouts as lay
from airflow_pglogrepl.pgoutput.columnar import (
    Column,
    ColumnarParser,
    ColumnarUnsupportedError,
    ParsedBatch,
    TupleRows,
    Txn,
    parse_rows,
    pick,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo

__all__ = ["ColumnarDecoder", "ColumnarUnsupportedError", "InProgress", "TablePiece"]

# the messages that are changes: what a sub-transaction's first change is looked for among
_DATA_KINDS = (lay.INSERT, lay.UPDATE, lay.DELETE, lay.TRUNCATE)


@dataclass(frozen=True)
class TablePiece:
    """Changelog rows of one table description, in commit order (``changelog_schema``)."""

    table: TableInfo
    rows: pa.Table


@dataclass(frozen=True)
class InProgress:
    """The rows of one block of streamed transaction ``xid``, still in progress: its commit
    LSN and time are 0 until its Stream Commit, its ``_xid`` is the top transaction's.
    ``first``: its first block (whatever was kept of it before is stale). ``firsts``: the
    ``_seq`` of each (sub-)transaction's first change in the block; ``next_seq``: the
    transaction's ``_seq`` after it (what a sub-transaction's abort drops up to)."""

    xid: int
    first: bool
    pieces: list[TablePiece]
    firsts: dict[int, int]
    next_seq: int


class ColumnarDecoder:
    """Decode pgoutput (proto_version 1, text tuples) into changelog rows batch by batch,
    keeping the open transaction and the table descriptions from one batch to the next."""

    def __init__(self, options: dict[str, str]) -> None:
        self._parser = ColumnarParser(options)
        # streamed transactions (``streaming 'on'``): their blocks cut out of each batch, and
        # the ``_seq`` each in-progress transaction's changes reached
        self._splitter = None
        if options.get("streaming", "off") in ("on", "true"):
            from airflow_pglogrepl.pgoutput.transaction_blocks import BlockSplitter

            self._splitter = BlockSplitter()
        self._seqs: dict[int, int] = {}

    @property
    def streams(self) -> bool:
        """Whether transactions may come in blocks while in progress (``parts`` says so)."""
        return self._splitter is not None

    @property
    def transactions(self) -> int:
        """Transactions committed in the batches so far."""
        return self._parser.transactions

    @property
    def commit_lsns(self) -> list[int]:
        """The commit record LSN (a row's ``_commit_lsn``) of each transaction committed so
        far, in order; the drain takes them off as it cuts windows (this very list)."""
        return self._parser.commit_lsns

    def feed(self, data: pa.Array) -> list[TablePiece]:
        """The changelog rows of one batch of messages (a ``binary`` or ``large_binary``
        array, in slot order), one piece per table description, in the order they appear.

        :raises ColumnarUnsupportedError: the batch needs the reference decoder. Anything that
            fails on this path (a malformed message the reference names precisely, a value
            no converter takes) declines too: the reference then decodes the window, and
            produces the rows or the error. The decoder is spent after a decline.
        """
        try:
            return self._feed(data)
        except ColumnarUnsupportedError:
            raise
        except Exception as exc:
            raise ColumnarUnsupportedError(f"{type(exc).__name__}: {exc}") from exc

    def parts(self, data: pa.Array) -> list[list[TablePiece] | InProgress | Any]:
        """One batch of messages, in order: the rows of whole transactions (a list of pieces,
        as ``feed`` returns them), the rows of a block of a transaction still in progress
        (``InProgress``), and the Stream Commits and Stream Aborts (``transaction_blocks``) that end
        such transactions. A Stream Commit's LSN joins ``commit_lsns`` in its place. Without
        ``streaming 'on'``, one list of pieces."""
        if self._splitter is None:
            return [self.feed(data)]
        try:
            return self._parts(data)
        except ColumnarUnsupportedError:
            raise
        except Exception as exc:
            raise ColumnarUnsupportedError(f"{type(exc).__name__}: {exc}") from exc

    def _parts(self, data: pa.Array) -> list[list[TablePiece] | InProgress | Any]:
        import numpy as np

        from airflow_pglogrepl.pgoutput.transaction_blocks import Block, Plain, StreamAbort

        assert self._splitter is not None
        out: list[list[TablePiece] | InProgress | Any] = []
        for part in self._splitter.split(data):
            if isinstance(part, Plain):
                out.append(self._feed(part.messages))
            elif isinstance(part, Block):
                if part.first:
                    self._parser.restart_in_progress(part.xid)
                seq = 0 if part.first else self._seqs.get(part.xid, 0)
                batch, after = self._parser.parse_in_progress(part.messages, part.xid, seq)
                self._seqs[part.xid] = after
                if batch is None:
                    continue
                data_kinds = np.isin(batch.kinds, np.array(_DATA_KINDS, dtype=np.uint8))
                subxids, seqs = part.subxids[data_kinds], batch.seq[data_kinds]
                found, firsts = np.unique(subxids, return_index=True)
                out.append(InProgress(
                    part.xid, part.first, self._pieces(batch),
                    dict(zip(found.tolist(), seqs[firsts].tolist(), strict=True)), after,
                ))  # fmt: skip
            else:
                if isinstance(part, StreamAbort):
                    if part.subxid == part.xid:
                        self._seqs.pop(part.xid, None)
                        self._parser.end_in_progress(part.xid, committed=False)
                else:  # a commit: in commit order with the whole transactions' commits
                    self._seqs.pop(part.xid, None)
                    self._parser.end_in_progress(part.xid, committed=True)
                    self._parser.commit_lsns.append(part.commit_lsn)
                    self._parser.transactions += 1
                out.append(part)
        return out

    def _feed(self, data: pa.Array) -> list[TablePiece]:
        batch = self._parser.parse(data)
        if batch is None:
            return []
        return self._pieces(batch)

    def _pieces(self, batch: ParsedBatch) -> list[TablePiece]:
        import numpy as np
        import pyarrow as pa

        # per table description: its parts and the message index of each of their rows
        groups: dict[int, tuple[TableInfo, list[pa.Table], list[np.ndarray]]] = {}

        def add(table: TableInfo, rows: pa.Table, order: np.ndarray) -> None:
            group = groups.setdefault(id(table), (table, [], []))
            group[1].append(rows)
            group[2].append(order)

        for table, chosen in batch.changes:
            parsed = parse_rows(table, batch.buf, batch.starts, batch.ends, batch.kinds, chosen)
            add(table, _rows(parsed, batch.buf, batch.seq, batch.txn_of, batch.txns), chosen)
        for index, tables in batch.truncates.items():
            txn = batch.txns[int(batch.txn_of[index])]
            for offset, table in enumerate(tables):
                row = truncate_row(table, txn.commit_lsn, int(batch.seq[index]) + offset, txn.xid,
                                   txn.commit_ts_us)  # fmt: skip
                add(table, row, np.array([index]))
        pieces = []
        for table, parts, orders in groups.values():
            order = np.concatenate(orders)
            rows = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            if len(parts) > 1:
                rows = rows.take(pa.array(np.argsort(order, kind="stable")))
            pieces.append((int(order.min()), TablePiece(table, rows)))
        pieces.sort(key=lambda item: item[0])
        return [piece for _, piece in pieces]


def _rows(
    parsed: TupleRows, buf: np.ndarray, seq: np.ndarray, txn_of: np.ndarray, txns: list[Txn]
) -> pa.Table:
    """The changelog rows of one table description's changes in a batch."""
    import numpy as np
    import pyarrow as pa

    table, kinds, deletes = parsed.table, parsed.kinds, parsed.deletes
    count = len(parsed.rows)
    # the row's columns: the new tuple (Insert, Update), or the old one (Delete)
    columns = []
    schema = cl.changelog_schema(table)
    for k, column in enumerate(table.columns):
        old = pick(parsed.old_cols, k, parsed.old_index, deletes)
        values = Column.combine(count, parsed.new_rows, parsed.new_cols[k], deletes, old)
        columns.append(_typed(values, buf, column, schema.field(k).type, table))
    op = np.full(count, ord(cl.INSERT), dtype=np.uint8)
    op[kinds == lay.UPDATE] = ord(cl.UPDATE)
    op[kinds == lay.DELETE] = ord(cl.DELETE)
    txn_index = txn_of[parsed.rows]
    lsn = np.array([t.commit_lsn for t in txns], dtype=np.uint64)[txn_index]
    xid = np.array([t.xid for t in txns], dtype=np.int64)[txn_index]
    stamp = np.array([t.commit_ts_us for t in txns], dtype=np.int64)[txn_index]
    unchanged = _unchanged(count, parsed.new_rows, parsed.new_cols, table.names, kinds)
    old_row = _old_struct(count, parsed.has_old, parsed.old_index, kinds == lay.UPDATE,
                          parsed.old_cols, buf, table, cl.old_type(schema))  # fmt: skip
    return assemble(
        schema,
        columns,
        op=pa.array(op.view("S1").astype(str), pa.string()),
        lsn=pa.array(lsn.astype(np.int64), pa.int64()),
        seq=pa.array(seq[parsed.rows], pa.int64()),
        xid=pa.array(xid, pa.int64()),
        ts=pa.array(stamp, pa.int64()),
        unchanged=unchanged,
        old=old_row,
    )


def _typed(
    values: Column, buf: np.ndarray, column: ColumnInfo, target: pa.DataType, table: TableInfo
) -> pa.Array:
    """A column's lake values, as the reference converters give them."""
    import pyarrow as pa

    if (values.marks == lay.KIND_BINARY).any():
        raise ColumnarUnsupportedError("binary tuple data")
    try:
        texts = values.texts(buf)
    except pa.ArrowInvalid as exc:
        raise ColumnarUnsupportedError(f"text that is not UTF-8: {exc}") from None
    return arrow_from_text_array(texts, column.value_type_oid, column.type_modifier, target)


def _unchanged(
    count: int,
    new_rows: np.ndarray,
    new_cols: list[Column],
    names: Sequence[str],
    kinds: np.ndarray,
) -> pa.Array:
    """``_unchanged``: per Update, the columns whose TOASTed value was not sent (sorted)."""
    import numpy as np
    import pyarrow as pa

    toast = np.zeros((count, len(names)), dtype=bool)
    for k, column in enumerate(new_cols):
        toast[new_rows, k] = column.marks == lay.KIND_TOAST
    toast[kinds != lay.UPDATE] = False
    if not toast.any():
        return pa.nulls(count, pa.list_(pa.string()))
    lists: list[list[str] | None] = [None] * count
    for row in np.flatnonzero(toast.any(axis=1)).tolist():
        lists[row] = sorted(names[k] for k in np.flatnonzero(toast[row]).tolist())
    return pa.array(lists, pa.list_(pa.string()))


def _old_struct(
    count: int,
    has_old: np.ndarray,
    old_index: np.ndarray,
    updates: np.ndarray,
    old_cols: list[Column] | None,
    buf: np.ndarray,
    table: TableInfo,
    old_type: pa.DataType,
) -> pa.Array:
    """``_old``: an Update's old row when the server sent it, else NULL."""
    import numpy as np
    import pyarrow as pa

    with_old = has_old & updates
    if old_cols is None or not with_old.any():
        return pa.nulls(count, old_type)
    rows = np.flatnonzero(with_old)
    fields = []
    for k, column in enumerate(table.columns):
        part = pick(old_cols, k, old_index, rows)
        values = Column.combine(count, rows, part, rows[:0], None)
        fields.append(_typed(values, buf, column, old_type.field(k).type, table))
    return pa.StructArray.from_arrays(fields, fields=list(old_type), mask=pa.array(~with_old))
