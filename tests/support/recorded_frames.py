"""Frames a walsender really sent, kept in a file for the protocol's unit tests.

``python -m tests.support.recorded_frames DSN SLOT PATH [--streaming]`` streams the slot
(pgoutput, publication ``pub``; protocol 1, or 2 with ``streaming 'on'``) until the server has
sent all it has and pinged us, and writes each frame as it came: a 4-byte big-endian length,
then the frame. ``load`` reads such a file back.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from airflow_pglogrepl.postgres import slot_stream
from airflow_pglogrepl.postgres.source import PgSource
from airflow_pglogrepl.postgres.stream_frames import FrameBatch

OPTIONS = {"proto_version": "1", "publication_names": '"pub"', "messages": "false"}
STREAMING = {**OPTIONS, "proto_version": "2", "streaming": "on"}


def load(path: Path) -> list[bytes]:
    data = path.read_bytes()
    frames, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from("!I", data, at)
        frames.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return frames


def record(dsn: str, slot: str, path: Path, options: dict[str, str] = OPTIONS) -> None:
    source = PgSource(dsn)
    end = source.flush_lsn()
    kept: list[bytes] = []
    split = slot_stream.frames

    def keep(chunks: list[bytes]) -> FrameBatch:
        kept.extend(bytes(c) for c in chunks)
        return split(chunks)

    slot_stream.frames = keep  # type: ignore[assignment]
    start = source.get_slot(slot).confirmed_flush_lsn
    with slot_stream.SlotStream(source.connection_params(), slot, label="recorder", start=start,
                                options=options) as stream:  # fmt: skip
        for batch in stream.batches():
            if batch.wal_end >= end and batch.keepalives:
                break
    path.write_bytes(b"".join(struct.pack("!I", len(f)) + f for f in kept))


if __name__ == "__main__":
    record(sys.argv[1], sys.argv[2], Path(sys.argv[3]),
           STREAMING if "--streaming" in sys.argv[4:] else OPTIONS)  # fmt: skip
