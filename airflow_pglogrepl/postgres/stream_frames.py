"""The streaming replication protocol's frames for a logical slot, as bytes: no I/O here.

Inside ``START_REPLICATION SLOT ... LOGICAL`` (COPY BOTH) a walsender sends two kinds of frame,
each one CopyData message:

- XLogData, ``'w'``: the WAL position the message belongs to, the server's WAL end and its
  clock (a 25-byte header), then one message of the output plugin (for pgoutput: Begin,
  Relation, Insert, ..., Commit);
- primary keepalive, ``'k'``: the server's WAL end, its clock, and whether it wants a reply now
  (a walsender ends a client it has not heard from within ``wal_sender_timeout``).

The client sends one: the standby status update, ``'r'``, with the positions it has received,
flushed and applied. For a logical slot the flushed position becomes the slot's
``confirmed_flush_lsn``, so the drain sends the lake's committed position there and nothing
later. See https://www.postgresql.org/docs/current/protocol-replication.html

``frames`` turns a batch of frames into one Arrow ``large_binary`` column of plugin messages
(one buffer plus offsets, what the columnar decoder reads) with numpy: the only Python object
per message is the ``bytes`` the driver hands over.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg import sql

from airflow_pglogrepl.exceptions import StreamProtocolError
from airflow_pglogrepl.identifiers import validate_slot_name
from airflow_pglogrepl.lsn import LSN

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from psycopg.abc import AdaptContext

__all__ = [
    "XLOG_DATA",
    "XLOG_HEADER",
    "FrameBatch",
    "Keepalive",
    "frames",
    "keepalive",
    "pg_now_us",
    "start_replication",
    "status_update",
]

XLOG_DATA = 0x77  # 'w'
KEEPALIVE = 0x6B  # 'k'
XLOG_HEADER = 25  # 'w', start LSN, WAL end, send time
KEEPALIVE_SIZE = 18  # 'k', WAL end, send time, reply requested
_KEEPALIVE = struct.Struct("!cQqB")
_STATUS = struct.Struct("!cQQQqB")
_XLOG = struct.Struct("!cQQq")

# PostgreSQL's clock counts microseconds from 2000-01-01 00:00 UTC.
_PG_EPOCH_S = 946_684_800


@dataclass(frozen=True)
class Keepalive:
    """A walsender's keepalive: its WAL end (every change before it was sent), its clock, and
    whether it ends the connection unless it hears from us soon."""

    wal_end: LSN
    server_time_us: int
    reply_requested: bool


@dataclass(frozen=True)
class FrameBatch:
    """Frames as received, split: the plugin messages in order, and the keepalives among them.

    ``messages`` is a ``large_binary`` array of the XLogData payloads; ``starts`` holds each
    message's WAL position (numpy uint64). ``wal_end`` is the highest WAL end any frame
    reported (0 when none did): every transaction that commits before it has been sent.
    """

    messages: pa.Array
    starts: np.ndarray
    keepalives: tuple[Keepalive, ...]
    wal_end: LSN

    @property
    def reply_requested(self) -> bool:
        return any(k.reply_requested for k in self.keepalives)


def pg_now_us(now: float | None = None) -> int:
    """The time ``now`` (default: the clock) as PostgreSQL counts it in the protocol."""
    return int(((time.time() if now is None else now) - _PG_EPOCH_S) * 1_000_000)


def status_update(
    *, received: int, flushed: int, now_us: int | None = None, reply: bool = False
) -> bytes:
    """A standby status update: ``received`` shows as ``pg_stat_replication.write_lsn``,
    ``flushed`` becomes the slot's ``confirmed_flush_lsn`` (and is reported as applied too).
    ``reply`` asks the walsender to answer with a keepalive at once."""
    if flushed > received:
        raise ValueError(f"flushed {LSN(flushed)} is past received {LSN(received)}")
    return _STATUS.pack(b"r", received, flushed, flushed,
                        pg_now_us() if now_us is None else now_us, int(reply))  # fmt: skip


def keepalive(frame: bytes | memoryview) -> Keepalive:
    """Parse one primary keepalive frame (``'k'``)."""
    if len(frame) != KEEPALIVE_SIZE or frame[0] != KEEPALIVE:
        got = f"{len(frame)} bytes starting with {bytes(frame[:1])!r}"
        raise StreamProtocolError(f"a keepalive frame is {KEEPALIVE_SIZE} bytes starting with 'k', "
                            f"got {got}")  # fmt: skip
    _, wal_end, sent, reply = _KEEPALIVE.unpack(frame)
    return Keepalive(LSN(wal_end), sent, bool(reply))


def xlog_data(start: int, wal_end: int, payload: bytes, *, now_us: int = 0) -> bytes:
    """One XLogData frame, as a walsender sends it (for tests and recorded streams)."""
    return _XLOG.pack(b"w", start, wal_end, now_us) + payload


def start_replication(
    slot: str, start: LSN | int, options: Mapping[str, str], context: AdaptContext | None
) -> bytes:
    """The ``START_REPLICATION SLOT ... LOGICAL`` command for ``slot`` from ``start``, with the
    output plugin's ``options``: names quoted as identifiers, values as the replication
    grammar's string constants (``replication_literal``). Nothing is pasted in."""
    validate_slot_name(slot)
    pairs = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(replication_literal(value)))
        for name, value in options.items()
    )
    command = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
        sql.Identifier(slot), sql.SQL(str(LSN(start))), pairs
    )
    return command.as_bytes(context)


def replication_literal(value: str) -> str:
    """``value`` as a string constant of the replication commands' grammar, which knows only
    ``'...'`` with ``''`` for a quote: a backslash is an ordinary character there, so
    ``sql.Literal``'s ``E'...'`` form (what psycopg writes for a value with a backslash) is a
    syntax error. Values cannot be bound in a replication command."""
    if "\x00" in value:
        raise ValueError("a replication command's value cannot hold a NUL character")
    return "'" + value.replace("'", "''") + "'"


def frames(chunks: Sequence[bytes | memoryview]) -> FrameBatch:
    """Split received frames into plugin messages and keepalives (see ``FrameBatch``).

    :raises StreamProtocolError: a frame neither XLogData nor keepalive, or one too short for its
        header.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    count = len(chunks)
    lengths = np.fromiter(map(len, chunks), dtype=np.int64, count=count)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    buf = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    if count and int(lengths.min()) == 0:
        raise StreamProtocolError("an empty CopyData frame in the replication stream")
    kinds = buf[starts] if count else np.zeros(0, np.uint8)
    is_data = kinds == XLOG_DATA
    is_keepalive = kinds == KEEPALIVE
    if not bool(np.all(is_data | is_keepalive)):
        bad = int(kinds[~(is_data | is_keepalive)][0])
        raise StreamProtocolError(f"a replication frame of unknown kind {bytes([bad])!r}")
    data_starts, data_ends = starts[is_data], ends[is_data]
    if data_starts.size and int((data_ends - data_starts).min()) < XLOG_HEADER:
        raise StreamProtocolError(f"an XLogData frame shorter than its {XLOG_HEADER}-byte header")
    # The frames' bytes read as gap, message, gap, message ... (offsets only, nothing copied);
    # taking every second element has Arrow copy the messages together in C, with no index
    # per byte (a gap: a header, and any keepalive before it).
    count = int(data_starts.size)
    offsets = np.zeros(2 * count + 1, dtype=np.int64)
    offsets[1::2], offsets[2::2] = data_starts + XLOG_HEADER, data_ends
    spans = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 2 * count, [None, pa.py_buffer(offsets), pa.py_buffer(buf)]
    )
    messages = pc.take(spans, pa.array(np.arange(1, 2 * count, 2, dtype=np.int64)))
    if messages.offset:  # buffers that start at the first message
        messages = pa.concat_arrays([messages])
    header = data_starts[:, None] + np.arange(1, 17)
    positions = buf[header].copy().view(">u8").astype(np.uint64)  # start, WAL end per message
    keeps = tuple(keepalive(chunks[i]) for i in np.flatnonzero(is_keepalive).tolist())
    wal_end = max([int(positions[:, 1].max()) if positions.size else 0,
                   *(int(k.wal_end) for k in keeps)])  # fmt: skip
    return FrameBatch(
        messages=messages,
        starts=positions[:, 0] if positions.size else np.zeros(0, np.uint64),
        keepalives=keeps,
        wal_end=LSN(wal_end),
    )
