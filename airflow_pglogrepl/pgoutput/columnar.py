"""The columnar back end of the pgoutput decoder: a batch of messages in one Arrow ``binary``
column, read with numpy over the whole batch, with no Python object per message or value.

The per-message back end (``per_message.PgOutputStream``) spends most of its time in CPython: a
``bytes`` object per message, a Python value per column. Here the messages stay in the column's
single buffer and its offsets:

- the message type of every row, and the Begin fields (commit LSN, commit time, xid) each change
  inherits from the transaction it sits in, with its order in that transaction (``_seq``);
- the tuple data of all Inserts, Updates and Deletes of one table description at once, one
  column at a time: the column's marker byte in every row, its length, where the next column
  starts (``Column``), and a column's values as one ``string`` array gathered from the buffer.

What the values become in the lake is the changelog stage's (``changelog.columnar``). Relation and
Type messages are rare and go through the relation cache both back ends share
(``relations.RelationCache``). Anything else this back end does not take (streamed or two-phase
transactions, logical messages, binary tuple data, and every malformed message) raises
``ColumnarUnsupportedError``: the caller decodes that window again with the per-message back
end, which produces the same rows or the error the message deserves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.pgoutput import layouts as lay
from airflow_pglogrepl.pgoutput.relations import RelationCache

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from airflow_pglogrepl.pgoutput.table_info import TableInfo

__all__ = ["Column", "ColumnarParser", "ColumnarUnsupportedError", "ParsedBatch", "TupleRows",
           "Txn", "parse_rows", "pick"]  # fmt: skip


class ColumnarUnsupportedError(Exception):
    """The batch holds something only the per-message back end takes: decode the window there."""


@dataclass
class Txn:
    """A transaction of the batch: what its changes inherit from its Begin."""

    xid: int
    commit_lsn: int
    commit_ts_us: int  # microseconds since 1970, UTC
    seq: int  # changes so far


@dataclass
class ParsedBatch:
    """One batch of messages, parsed: the buffer and where each message lies in it, each
    message's ``_seq`` and transaction, the changes of each table description (message
    indexes), and the tables each Truncate names (by message index)."""

    buf: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    kinds: np.ndarray
    seq: np.ndarray
    txn_of: np.ndarray
    txns: list[Txn]
    changes: list[tuple[TableInfo, np.ndarray]]
    truncates: dict[int, list[TableInfo]]


@dataclass
class TupleRows:
    """The Inserts, Updates and Deletes of one table description in one batch, their tuples
    parsed column by column: the new tuple's columns (``new_cols``, for the rows ``new_rows``),
    the old tuple's (``old_cols``, for the rows with ``has_old``; ``old_index`` maps a row to
    its place among those), and which rows are Deletes."""

    table: TableInfo
    rows: np.ndarray  # message indexes
    kinds: np.ndarray
    new_rows: np.ndarray
    new_cols: list[Column]
    has_old: np.ndarray
    old_index: np.ndarray
    old_cols: list[Column] | None
    deletes: np.ndarray


class ColumnarParser:
    """Parse pgoutput (proto_version 1, text tuples) batch by batch, keeping the open
    transaction and the table descriptions from one batch to the next."""

    def __init__(self, options: dict[str, str]) -> None:
        streaming = options.get("streaming", "off")
        if streaming not in ("off", "false", "on", "true") or options.get(
            "binary", "false"
        ) not in ("false", "off"):
            raise ColumnarUnsupportedError("streaming 'parallel' and binary tuples")
        self._relations = RelationCache(proto_version=int(options.get("proto_version", "1")))
        # the tables each streamed transaction in progress described (``parse_in_progress``)
        self._overlays: dict[int, dict[int, TableInfo]] = {}
        self._txn: Txn | None = None
        self.transactions = 0
        # the commit record LSN (a row's ``_commit_lsn``) of each transaction committed so far,
        # in order; the drain takes them off as it cuts windows
        self.commit_lsns: list[int] = []
        # the table descriptions as the batch being parsed found them (before its Relations)
        self._before: dict[int, TableInfo] = {}

    def parse_in_progress(
        self, data: pa.Array, xid: int, seq: int
    ) -> tuple[ParsedBatch | None, int]:
        """A block of streamed transaction ``xid`` (``transaction_blocks.Block``'s messages),
        whose changes so far numbered ``seq``: parsed as inside that transaction, with no commit
        LSN or time yet (0). Returns the batch and the transaction's ``_seq`` after it."""
        assert self._txn is None, "blocks are sent between whole transactions"
        shared = self._relations
        overlay = self._overlays.setdefault(xid, {})
        self._relations = shared.scoped(overlay)  # its Relations are its own until its commit
        self._txn = Txn(xid, 0, 0, seq)
        try:
            batch = self.parse(data)
            if self._txn is not None:
                seq = self._txn.seq
            for relid, table in self._relations.tables.items():
                if shared.tables.get(relid) is not table:
                    overlay[relid] = table
        finally:
            self._txn = None
            self._relations = shared
        return batch, seq

    def end_in_progress(self, xid: int, *, committed: bool) -> None:
        """Streamed transaction ``xid`` ended: the tables it described become everyone's
        when it committed, and are forgotten when it rolled back."""
        for table in self._overlays.pop(xid, {}).values():
            if committed:
                self._relations.describe(table)

    def restart_in_progress(self, xid: int) -> None:
        """A first block of ``xid`` again (a new stream): what it described before is stale."""
        self._overlays.pop(xid, None)

    def parse(self, data: pa.Array) -> ParsedBatch | None:
        """One batch of messages (a ``binary`` or ``large_binary`` array, in slot order);
        None for an empty batch."""
        import numpy as np

        if data.null_count:
            raise ColumnarUnsupportedError("a NULL message")
        count = len(data)
        if count == 0:
            return None
        buf, starts, ends = buffers(data)
        kinds = buf[starts]
        taken = [lay.BEGIN, lay.COMMIT, lay.INSERT, lay.UPDATE, lay.DELETE, lay.RELATION, lay.TYPE,
                 lay.TRUNCATE, lay.ORIGIN]  # fmt: skip
        known = np.isin(kinds, np.array(taken, dtype=np.uint8))
        if not known.all():
            raise ColumnarUnsupportedError(f"message type {chr(kinds[~known][0])!r}")
        if (ends - starts < 1).any():
            raise ColumnarUnsupportedError("an empty message")
        is_change = (kinds == lay.INSERT) | (kinds == lay.UPDATE) | (kinds == lay.DELETE)
        # Relations, Types, Truncates and Origins: in order, through the reference handlers;
        # each change then belongs to the description current at its position.
        special = np.flatnonzero((kinds == lay.RELATION) | (kinds == lay.TYPE)
                                 | (kinds == lay.TRUNCATE) | (kinds == lay.ORIGIN))  # fmt: skip
        truncates: dict[int, list[TableInfo]] = {}
        versions: dict[int, list[tuple[int, TableInfo]]] = {}
        self._before = dict(self._relations.tables)
        for index in special.tolist():
            raw = buf[starts[index] : ends[index]].tobytes()
            kind = kinds[index]
            if kind == lay.TRUNCATE:
                truncates[index] = self._truncated(raw)
            elif kind == lay.ORIGIN:
                continue  # the origin of the transaction: not part of the changelog
            else:
                self._relations.feed(raw)
                if kind == lay.RELATION:
                    relid = int.from_bytes(raw[1:5], "big")
                    versions.setdefault(relid, []).append((index, self._relations.tables[relid]))
        seq, txn_of, txns = self._transactions(buf, starts, ends, kinds, truncates)
        changes: list[tuple[TableInfo, np.ndarray]] = []
        change_index = np.flatnonzero(is_change)
        if len(change_index):
            relids = _be_u32(buf, starts[change_index] + lay.ROW_RELID)
            for relid in np.unique(relids).tolist():
                rows = change_index[relids == relid]
                changes.extend(self._by_version(relid, rows, versions))
        return ParsedBatch(buf, starts, ends, kinds, seq, txn_of, txns, changes, truncates)

    # -- transactions ----------------------------------------------------------------------

    def _transactions(
        self,
        buf: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        kinds: np.ndarray,
        truncates: dict[int, list[TableInfo]],
    ) -> tuple[np.ndarray, np.ndarray, list[Txn]]:
        """Per message: its ``_seq`` in its transaction and the index of that transaction in
        the returned list (index 0: the one open when the batch began, if any)."""
        import numpy as np

        begins = np.flatnonzero(kinds == lay.BEGIN)
        commits = np.flatnonzero(kinds == lay.COMMIT)
        if ((ends[begins] - starts[begins]) != lay.BEGIN_SIZE).any() or (
            (ends[commits] - starts[commits]) != lay.COMMIT_SIZE
        ).any():
            raise ColumnarUnsupportedError("a Begin or Commit of unexpected length")
        txns: list[Txn] = [self._txn or Txn(0, 0, 0, 0)]
        lsns = _be_u64(buf, starts[begins] + lay.BEGIN_LSN)
        stamps = _be_i64(buf, starts[begins] + lay.BEGIN_TS)
        xids = _be_u32(buf, starts[begins] + lay.BEGIN_XID)
        for lsn, stamp, xid in zip(lsns.tolist(), stamps.tolist(), xids.tolist(), strict=True):
            txns.append(Txn(xid, lsn, stamp + lay.PG_EPOCH_US, 0))
        # which transaction each message belongs to, and whether one is open there
        txn_of = np.searchsorted(begins, np.arange(len(kinds)), side="right")
        opened = np.zeros(len(kinds), dtype=np.int64)
        opened[begins] = 1
        closed = np.zeros(len(kinds), dtype=np.int64)
        closed[commits] = 1
        # open transactions after each message: 1 from a Begin to its Commit (exclusive)
        depth = np.cumsum(opened) - np.cumsum(closed) + (1 if self._txn is not None else 0)
        is_change = (kinds == lay.INSERT) | (kinds == lay.UPDATE) | (kinds == lay.DELETE)
        data_kinds = is_change | (kinds == lay.TRUNCATE)
        if (depth[data_kinds] != 1).any() or (depth < 0).any() or (depth > 1).any():
            raise ColumnarUnsupportedError("a change outside a transaction, or nested Begins")
        # _seq: changes before this one since its Begin (a Truncate counts once per table)
        step = is_change.astype(np.int64)
        for index, tables in truncates.items():
            step[index] = len(tables)
        before = np.cumsum(step) - step
        base = np.zeros(len(txns), dtype=np.int64)
        base[1:] = before[begins]
        seq = before - base[txn_of]
        seq[txn_of == 0] += txns[0].seq
        # carry the transaction still open at the end into the next batch
        if depth[-1] == 1:  # the last message belongs to the transaction still open
            still = txns[-1]
            carried = int(seq[-1] + step[-1])
            self._txn = Txn(still.xid, still.commit_lsn, still.commit_ts_us, carried)
        else:
            self._txn = None
        self.transactions += len(commits)
        if len(commits):
            self.commit_lsns.extend(_be_u64(buf, starts[commits] + lay.COMMIT_LSN).tolist())
        return seq, txn_of, txns

    def _truncated(self, raw: bytes) -> list[TableInfo]:
        """The tables a Truncate message names, as the reference decoder describes them."""
        if len(raw) < 6:
            raise ColumnarUnsupportedError("a short Truncate")
        count = int.from_bytes(raw[1:5], "big")
        if len(raw) != 6 + 4 * count:
            raise ColumnarUnsupportedError("a Truncate of unexpected length")
        tables = []
        for i in range(count):
            relid = int.from_bytes(raw[6 + 4 * i : 10 + 4 * i], "big")
            table = self._relations.tables.get(relid)
            if table is None:
                raise ColumnarUnsupportedError(f"a Truncate of unknown relation {relid}")
            tables.append(table)
        return tables

    def _by_version(
        self, relid: int, rows: np.ndarray, versions: dict[int, list[tuple[int, TableInfo]]]
    ) -> list[tuple[TableInfo, np.ndarray]]:
        """``rows`` (message indexes of one relation) split by the description each used."""
        import numpy as np

        described = versions.get(relid, [])
        current = self._relations.tables.get(relid)
        if current is None:
            raise ColumnarUnsupportedError(f"a change of unknown relation {relid}")
        if not described:
            return [(current, rows)]
        out = []
        positions = np.array([index for index, _ in described])
        version = np.searchsorted(positions, rows, side="right")  # 0: before the first R
        for v in np.unique(version).tolist():
            chosen = rows[version == v]
            if v == 0:
                # described before this batch: the description before the batch's first R
                table = self._before.get(relid)
                if table is None:
                    raise ColumnarUnsupportedError(f"a change of unknown relation {relid}")
            else:
                table = described[v - 1][1]
            out.append((table, chosen))
        return out


def parse_rows(
    table: TableInfo,
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    kinds: np.ndarray,
    rows: np.ndarray,
) -> TupleRows:
    """The tuples of the changes ``rows`` (message indexes) of one table description."""
    import numpy as np

    ends = ends[rows]
    kinds = kinds[rows]
    starts = starts[rows]
    marker = buf[starts + lay.ROW_MARKER]
    has_old = (kinds != lay.INSERT) & ((marker == lay.OLD_KEY) | (marker == lay.OLD_ROW))
    plain = (kinds == lay.INSERT) | ((kinds == lay.UPDATE) & ~has_old)
    if (plain & (marker != lay.NEW_TUPLE)).any():
        raise ColumnarUnsupportedError("an unexpected tuple marker")
    if ((kinds == lay.DELETE) & ~has_old).any():
        raise ColumnarUnsupportedError("a Delete without its old tuple")
    tuple_at = starts + lay.ROW_TUPLE
    names = table.names
    width = len(names)
    old_cols: list[Column] | None = None
    if has_old.any():
        old_rows = np.flatnonzero(has_old)
        old_cols, old_end = _parse_tuple(buf, tuple_at[old_rows], width)
        # an Update's new tuple follows its old one after an 'N'
        update_old = kinds[old_rows] == lay.UPDATE
        delete_end = old_end[~update_old]
        if (delete_end != ends[old_rows][~update_old]).any():
            raise ColumnarUnsupportedError("bytes after a Delete's tuple")
        new_at = old_end[update_old]
        if (buf[np.minimum(new_at, len(buf) - 1)] != lay.NEW_TUPLE).any():
            raise ColumnarUnsupportedError("an Update without its new tuple")
        tuple_at = tuple_at.copy()
        tuple_at[old_rows[update_old]] = new_at + 1
    new_rows = np.flatnonzero(kinds != lay.DELETE)
    new_cols, new_end = _parse_tuple(buf, tuple_at[new_rows], width)
    if (new_end != ends[new_rows]).any():
        raise ColumnarUnsupportedError("bytes after a tuple")
    deletes = np.flatnonzero(kinds == lay.DELETE)
    old_index = np.cumsum(has_old) - 1  # row -> its place among the rows with an old tuple
    return TupleRows(table, rows, kinds, new_rows, new_cols, has_old, old_index, old_cols,
                     deletes)  # fmt: skip


@dataclass
class Column:
    """One column of many tuples: marker byte, value start and length (message buffer)."""

    marks: np.ndarray
    at: np.ndarray
    size: np.ndarray

    @staticmethod
    def combine(
        count: int, rows_a: np.ndarray, a: Column, rows_b: np.ndarray, b: Column | None
    ) -> Column:
        import numpy as np

        marks = np.full(count, lay.KIND_NULL, dtype=np.uint8)
        at = np.zeros(count, dtype=np.int64)
        size = np.zeros(count, dtype=np.int64)
        for rows, part in ((rows_a, a), (rows_b, b)):
            if part is None or not len(rows):
                continue
            marks[rows], at[rows], size[rows] = part.marks, part.at, part.size
        return Column(marks, at, size)

    def texts(self, buf: np.ndarray) -> pa.Array:
        """The values as one ``string`` array (NULL where no text was sent).

        The values lie in the message buffer in row order, with other bytes between them. So
        the buffer is read as a ``binary`` array of gap, value, gap, value ... (offsets only,
        the bytes not copied) and ``take`` keeps every second element: Arrow copies the values'
        bytes in C, with no per-byte index.
        """
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        valid = self.marks == lay.KIND_TEXT
        count = len(valid)
        size = np.where(valid, self.size, 0)
        ends = np.where(valid, self.at + size, 0)
        reached = np.maximum.accumulate(ends) if count else ends
        at = np.where(valid, self.at, np.concatenate(([0], reached[:-1])) if count else ends)
        ends = at + size
        if count and ((at[1:] < ends[:-1]).any() or at[0] < 0 or ends[-1] > len(buf)):
            raise ColumnarUnsupportedError("values out of order in their messages")
        offsets = np.zeros(2 * count + 1, dtype=np.int64)
        offsets[1::2], offsets[2::2] = at, ends
        large = count and ends[-1] >= 2**31
        kind, offset_type = (pa.large_binary(), np.int64) if large else (pa.binary(), np.int32)
        spans = pa.Array.from_buffers(
            kind, 2 * count, [None, pa.py_buffer(offsets.astype(offset_type)), pa.py_buffer(buf)]
        )
        values = pc.take(spans, pa.array(np.arange(1, 2 * count, 2, dtype=np.int64)))
        if values.offset:  # buffers that start at the first value, as the mask does
            values = pa.concat_arrays([values])
        mask = None if valid.all() else pa.array(valid).buffers()[1]
        string_type = pa.large_string() if large else pa.string()
        array = pa.Array.from_buffers(string_type, count, [mask, *values.buffers()[1:]])
        array.validate(full=True)  # UTF-8, as the reference's bytes.decode would insist
        return array if string_type == pa.string() else array.cast(pa.string())


def pick(old_cols: list[Column] | None, k: int, old_index: np.ndarray, rows: np.ndarray) -> Any:
    """Column ``k`` of the old tuples, for the message rows ``rows`` (all of which have one);
    ``old_index`` maps a row to its place among the rows with an old tuple."""
    if old_cols is None or not len(rows):
        return None
    chosen = old_index[rows]
    part = old_cols[k]
    return Column(part.marks[chosen], part.at[chosen], part.size[chosen])


def _parse_tuple(buf: np.ndarray, at: np.ndarray, width: int) -> tuple[list[Column], np.ndarray]:
    """TupleData of many messages, column by column: the columns and where each tuple ends."""
    import numpy as np

    limit = len(buf)
    if (at + 2 > limit).any():
        raise ColumnarUnsupportedError("a tuple past the end of its message")
    if (_be_u16(buf, at) != width).any():
        raise ColumnarUnsupportedError("a tuple with another column count than its Relation")
    position = at + 2
    columns = []
    for _ in range(width):
        if (position >= limit).any():
            raise ColumnarUnsupportedError("a tuple past the end of its message")
        marks = buf[position]
        text = (marks == lay.KIND_TEXT) | (marks == lay.KIND_BINARY)
        if not (text | (marks == lay.KIND_NULL) | (marks == lay.KIND_TOAST)).all():
            raise ColumnarUnsupportedError("an unknown column marker")
        size = np.zeros(len(position), dtype=np.int64)
        if text.any():
            if (position[text] + 5 > limit).any():
                raise ColumnarUnsupportedError("a length past the end of its message")
            size[text] = _be_u32(buf, position[text] + 1)
        start = position + 5
        columns.append(Column(marks, start, size))
        position = np.where(text, start + size, position + 1)
        if (position > limit).any():
            raise ColumnarUnsupportedError("a value past the end of its message")
    return columns, position


# -- the message buffer ---------------------------------------------------------------------


def buffers(data: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The messages' bytes as one uint8 array, with each message's start and end in it."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_large_binary(data.type):
        offset_type: Any = np.int64
    elif pa.types.is_binary(data.type):
        offset_type = np.int32
    else:
        raise ColumnarUnsupportedError(f"messages as {data.type}, not binary")
    _, offsets_buffer, data_buffer = data.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[
        data.offset : data.offset + len(data) + 1
    ].astype(np.int64)
    buf = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer else np.zeros(1, np.uint8)
    return buf, offsets[:-1], offsets[1:]


def _words(buf: np.ndarray, at: np.ndarray, dtype: str) -> np.ndarray:
    """The big-endian numbers of ``dtype`` starting at the offsets ``at``: read through a view
    of the buffer with one (unaligned) number at every byte, so one gather reads them all."""
    import numpy as np

    width = np.dtype(dtype).itemsize
    if len(at) and (at.min() < 0 or at.max() + width > len(buf)):
        raise ColumnarUnsupportedError("a field past the end of the messages")
    if len(buf) < width:
        return np.zeros(0, dtype=dtype)
    words: np.ndarray = np.ndarray((len(buf) - width + 1,), dtype=dtype, buffer=buf, strides=(1,))
    picked: np.ndarray = words[at]
    return picked


def _be_u16(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _words(buf, at, ">u2").astype("int64")


def _be_u32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _words(buf, at, ">u4").astype("int64")


def _be_u64(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _words(buf, at, ">u8").astype("uint64")


def _be_i64(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _words(buf, at, ">i8").astype("int64")
