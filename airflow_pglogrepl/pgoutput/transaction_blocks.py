"""Streamed transactions in a batch of pgoutput messages (protocol 2, ``streaming 'on'``): the
batch cut into what the columnar decoder reads as it is and what belongs to a transaction still
in progress.

With ``streaming 'on'`` a transaction bigger than ``logical_decoding_work_mem`` is sent while it
runs, in blocks: Stream Start (``S``: its xid, whether this is its first block), its changes,
Stream Stop (``E``). Blocks of several transactions interleave with whole transactions (``B`` ..
``C``), never inside one. Stream Commit (``c``) ends such a transaction with its commit LSN and
time, Stream Abort (``A``) drops it, or only one of its sub-transactions. Inside a block every
Relation, Type, Insert, Update, Delete, Truncate and logical Message carries, after its type
byte, the xid of the (sub-)transaction that made it; removed here, the block's messages have
the layouts the decoder reads elsewhere. See
https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.pgoutput import layouts as lay
from airflow_pglogrepl.pgoutput.columnar import ColumnarUnsupportedError, buffers

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["Block", "BlockSplitter", "Plain", "StreamAbort", "StreamCommit"]

_CONTROL = (lay.STREAM_START, lay.STREAM_STOP, lay.STREAM_COMMIT, lay.STREAM_ABORT)


@dataclass(frozen=True)
class Plain:
    """Messages outside any block: whole transactions, as without streaming."""

    messages: pa.Array


@dataclass(frozen=True)
class Block:
    """Changes of transaction ``xid``, still in progress, without their xids; ``subxids`` is the
    (sub-)transaction of each message (0 where none is sent). ``first``: the server's first
    block of this transaction since the stream began (anything kept of it before is stale)."""

    xid: int
    first: bool
    messages: pa.Array
    subxids: np.ndarray


@dataclass(frozen=True)
class StreamCommit:
    """Transaction ``xid``, sent in blocks, committed."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int  # microseconds since 1970, UTC


@dataclass(frozen=True)
class StreamAbort:
    """Transaction ``xid`` rolled back (``subxid == xid``), or its sub-transaction ``subxid``."""

    xid: int
    subxid: int


Part = Plain | Block | StreamCommit | StreamAbort


class BlockSplitter:
    """Cut batches of messages into ``Part``s, in order; a block may span batches."""

    def __init__(self) -> None:
        self._open: int | None = None  # the xid of the block still open at a batch's end
        self._first = False  # whether that block is its transaction's first (none of it came)

    def split(self, data: pa.Array) -> list[Part]:
        import numpy as np

        if len(data) == 0:
            return []
        buf, starts, ends = buffers(data)
        kinds = buf[starts]
        controls = np.flatnonzero(np.isin(kinds, np.array(_CONTROL, dtype=np.uint8)))
        if self._open is None and not len(controls):
            return [Plain(data)]  # the common case: no streamed transaction in sight
        parts: list[Part] = []
        first = self._first
        done = 0
        for index in [*controls.tolist(), len(data)]:
            if index > done:
                if self._open is None:
                    parts.append(Plain(data.slice(done, index - done)))
                else:
                    messages, subxids = _without_xids(buf, starts[done:index], ends[done:index])
                    parts.append(Block(self._open, first, messages, subxids))
                    first = False
            if index == len(data):
                self._first = first  # a Stream Start ended the batch: its block is still first
                break
            raw = buf[starts[index] : ends[index]].tobytes()
            kind = raw[0]
            if kind == lay.STREAM_START:
                if self._open is not None or len(raw) != 6:
                    raise ColumnarUnsupportedError("a Stream Start inside a block, or malformed")
                self._open, first = int.from_bytes(raw[1:5], "big"), raw[5] == 1
            elif kind == lay.STREAM_STOP:
                if self._open is None:
                    raise ColumnarUnsupportedError("a Stream Stop outside a block")
                self._open, first = None, False
            elif self._open is not None:
                raise ColumnarUnsupportedError(f"a {chr(kind)!r} message inside a block")
            elif kind == lay.STREAM_COMMIT:
                parts.append(_stream_commit(raw))
            else:  # STREAM_ABORT; proto 4 adds its LSN and time (streaming 'parallel' only)
                if len(raw) not in (9, 25):
                    raise ColumnarUnsupportedError("a Stream Abort of unexpected length")
                parts.append(StreamAbort(int.from_bytes(raw[1:5], "big"),
                                         int.from_bytes(raw[5:9], "big")))  # fmt: skip
            done = index + 1
        return parts


def _stream_commit(raw: bytes) -> StreamCommit:
    if len(raw) != lay.STREAM_COMMIT_SIZE:
        raise ColumnarUnsupportedError("a Stream Commit of unexpected length")
    return StreamCommit(
        xid=int.from_bytes(raw[1:5], "big"),
        commit_lsn=int.from_bytes(raw[6:14], "big"),
        end_lsn=int.from_bytes(raw[14:22], "big"),
        commit_ts_us=int.from_bytes(raw[22:30], "big", signed=True) + lay.PG_EPOCH_US,
    )


def _without_xids(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[Any, Any]:
    """The block's messages with the xid after each type byte removed (one ``large_binary``
    array, gathered at once), and those xids (0 for a message without one)."""
    import numpy as np
    import pyarrow as pa

    kinds = buf[starts]
    carries = np.isin(kinds, np.array(lay.WITH_XID_IN_BLOCK, dtype=np.uint8))
    if ((ends - starts)[carries] < 5).any():
        raise ColumnarUnsupportedError("a streamed message shorter than its xid")
    at = starts[carries]
    subxids = np.zeros(len(starts), dtype=np.int64)
    subxids[carries] = (
        (buf[at + 1].astype(np.int64) << 24) | (buf[at + 2].astype(np.int64) << 16)
        | (buf[at + 3].astype(np.int64) << 8) | buf[at + 4].astype(np.int64)
    )  # fmt: skip
    first, last = int(starts[0]), int(ends[-1])
    keep = np.ones(last - first, dtype=bool)
    keep[((at - first + 1)[:, None] + np.arange(4)).ravel()] = False
    # messages are contiguous in the buffer: the gaps between them are kept out too
    gaps = np.flatnonzero(starts[1:] != ends[:-1])
    for gap in gaps.tolist():
        keep[int(ends[gap]) - first : int(starts[gap + 1]) - first] = False
    data = buf[first:last][keep]
    sizes = (ends - starts) - 4 * carries
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    messages = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return messages, subxids
