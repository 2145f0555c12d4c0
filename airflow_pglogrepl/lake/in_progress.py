"""Rows of streamed transactions still in progress at the source, kept in the lake until their
Stream Commit says where they belong, and dropped on their Stream Abort.

With ``streaming 'on'`` (``pgoutput.transaction_blocks``) the server sends a big transaction
while it runs, instead of keeping it in its spill files until its commit. Its rows cannot join a
window before they have a commit LSN: that is what orders them and what the slot is confirmed
by. They wait here as Arrow IPC files (zstd) under ``_pglogrepl/in_progress/<xid>/``, which no
Delta log names and no reader lists (``VACUUM`` skips directories whose names start with ``_``),
one file per block and table description. At the Stream Commit each file is read back, one at a
time, given the commit LSN and time, and handed to the window like any transaction's rows; then
it is removed.

Why nothing here outlives a run: the slot is only ever confirmed up to a commit the lake holds.
A transaction still in progress commits past that, so a new stream (after a crash, a stopped
run, a decline to the peek) sends it again from its first change, with the first-block flag: what
a run left here is removed at the next stream's start (``clear``), and a first block replaces
whatever is kept of its transaction.

A sub-transaction's abort (``ROLLBACK TO SAVEPOINT``) drops its changes and everything sent
after its first change until the abort, the rule PostgreSQL's own apply worker uses: nested
sub-transactions follow their parent's first change. The changes are recognised by ``_seq``
(their order in the transaction), and the ``_seq`` of what stays is renumbered without gaps, as
the server numbers a transaction it sends whole.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import COMMIT_LSN, COMMIT_TS, SEQ
from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake import storage

if TYPE_CHECKING:
    from airflow_pglogrepl.changelog.columnar import InProgress, TablePiece
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.pgoutput.table_info import TableInfo
    from airflow_pglogrepl.pgoutput.transaction_blocks import StreamCommit

__all__ = ["InProgressTransactions"]

log = logging.getLogger("airflow_pglogrepl.lake")
# zstd: about half the bytes of plain Arrow for changelog rows, so half the puts' size on a store
_COMPRESSION = "zstd"


@dataclass
class _Transaction:
    files: list[tuple[str, TableInfo]] = field(default_factory=list)  # path, description
    firsts: dict[int, int] = field(default_factory=dict)  # subxid -> _seq of its first change
    next_seq: int = 0
    dropped: list[tuple[int, int]] = field(default_factory=list)  # _seq ranges [from, to)
    rows: int = 0


class InProgressTransactions:
    """The streamed transactions of one run, by top-level xid (see the module docstring)."""

    def __init__(self, lake: Lake) -> None:
        self.uri = lake.paths.in_progress()
        self._system, self._base = storage.filesystem(self.uri)
        self._open: dict[int, _Transaction] = {}
        self._files = 0

    @property
    def rows(self) -> int:
        """Rows kept for transactions still in progress."""
        return sum(t.rows for t in self._open.values())

    def clear(self) -> None:
        """Remove everything kept, this run's and what an earlier one left. Best effort: a
        store that refuses leaves files no reader lists, which the next run removes; the run's
        own error, if it has one, is the one to see."""
        self._open.clear()
        try:
            self._system.delete_dir(self._base)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("%s: rows of transactions in progress could not be removed (%s: %s); "
                        "the next run tries again. The lake's store must let the drain delete "
                        "under _pglogrepl/", self.uri, type(exc).__name__, exc)  # fmt: skip

    def report(self, *, cut_short: bool = False) -> None:
        """Log the transactions whose rows came without their commit and are dropped (a run
        ends, or hands over to the peek): the next run receives them again from their start.

        ``cut_short``: the stream ended before the run's end (a lost connection, a declined
        window), so the commit may well have been sent and lost with it: nothing is claimed
        of the source, and the hand-over's peek reads such a transaction whole. Otherwise the
        transaction had not committed at the run's end: a long open one costs every run."""
        for xid, txn in self._open.items():
            if not txn.rows:
                continue
            if cut_short:
                log.info("transaction %s: %d of its rows came before the stream ended, without "
                         "its commit; they are dropped, and whatever reads on receives the "
                         "transaction whole", xid, txn.rows)  # fmt: skip
            else:
                log.warning("transaction %s had not committed at this run's end: %d of its rows "
                            "came and are dropped; every run receives it again from its start "
                            "until it commits or rolls back (a long open transaction: see "
                            "pg_stat_activity)", xid, txn.rows)  # fmt: skip

    def add(self, block: InProgress) -> None:
        """Keep the rows of one block."""
        import pyarrow as pa

        if block.first:
            self._drop(block.xid)
        txn = self._open.setdefault(block.xid, _Transaction())
        directory = f"{self._base}/{block.xid}"
        for piece in block.pieces:
            if not piece.rows.num_rows:
                continue
            if not txn.files:
                self._system.create_dir(directory, recursive=True)
            self._files += 1
            path = f"{directory}/{self._files:010d}.arrow"
            options = pa.ipc.IpcWriteOptions(compression=_COMPRESSION)
            with (
                self._system.open_output_stream(path) as sink,
                pa.ipc.new_stream(sink, piece.rows.schema, options=options) as writer,
            ):
                writer.write_table(piece.rows)
            fault("in_progress_kept")
            txn.files.append((path, piece.table))
            txn.rows += piece.rows.num_rows
        for subxid, seq in block.firsts.items():
            txn.firsts.setdefault(subxid, seq)
        txn.next_seq = block.next_seq

    def abort(self, xid: int, subxid: int) -> None:
        """Stream Abort: drop transaction ``xid``, or only its sub-transaction ``subxid``."""
        if subxid == xid:
            self._drop(xid)
            return
        txn = self._open.get(xid)
        first = None if txn is None else txn.firsts.get(subxid)
        if txn is None or first is None:
            return  # nothing of it was sent: the server dropped its changes itself
        txn.dropped.append((first, txn.next_seq))
        txn.firsts = {s: f for s, f in txn.firsts.items() if f < first}

    def commit(self, commit: StreamCommit) -> Iterator[TablePiece]:
        """Stream Commit: the transaction's rows, a file at a time, with their commit LSN and
        time and ``_seq`` renumbered past its aborted sub-transactions; each file is removed
        once the next is asked for, and the transaction is forgotten."""
        import pyarrow as pa

        from airflow_pglogrepl.changelog.columnar import TablePiece

        txn = self._open.pop(commit.xid, None)
        if txn is None:
            return
        dropped = _merged(txn.dropped)
        try:
            for path, table in txn.files:
                with self._system.open_input_stream(path) as stream:
                    rows = pa.ipc.open_stream(stream).read_all()
                rows = _committed(rows, commit, dropped)
                if rows.num_rows:
                    yield TablePiece(table, rows)
                with contextlib.suppress(OSError):  # else removed by ``clear``
                    self._system.delete_file(path)
        finally:
            with contextlib.suppress(OSError):
                self._system.delete_dir(f"{self._base}/{commit.xid}")

    def _drop(self, xid: int) -> None:
        if self._open.pop(xid, None) is not None:
            with contextlib.suppress(OSError):
                self._system.delete_dir(f"{self._base}/{xid}")


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping ``[from, to)`` ranges joined (a parent's abort covers its children's)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def _committed(rows: Any, commit: StreamCommit, dropped: list[tuple[int, int]]) -> Any:
    """``rows`` with the transaction's commit LSN and time, without the changes of aborted
    sub-transactions (``_seq`` in ``dropped``), the others' ``_seq`` closing the gaps."""
    import numpy as np
    import pyarrow as pa

    if dropped:
        seq = rows.column(SEQ).to_numpy()
        starts = np.array([s for s, _ in dropped], dtype=np.int64)
        ends = np.array([e for _, e in dropped], dtype=np.int64)
        inside = np.searchsorted(starts, seq, side="right") - 1  # the range starting at or before
        keep = (inside < 0) | (seq >= ends[np.maximum(inside, 0)])
        widths = np.concatenate([[0], np.cumsum(ends - starts)])
        shift = widths[np.searchsorted(ends, seq, side="right")]
        rows = rows.filter(pa.array(keep))
        new_seq = (seq - shift)[keep]
        rows = rows.set_column(rows.schema.get_field_index(SEQ), SEQ,
                               pa.array(new_seq, rows.schema.field(SEQ).type))  # fmt: skip
    count = rows.num_rows
    for name, value in ((COMMIT_LSN, commit.commit_lsn), (COMMIT_TS, commit.commit_ts_us)):
        index = rows.schema.get_field_index(name)
        kind = rows.schema.field(name).type
        column = pa.array(np.full(count, value, dtype=np.int64))
        rows = rows.set_column(index, name, column.cast(kind) if kind != pa.int64() else column)
    return rows
