"""A keyed batch too big to reduce in memory, split by key hash into buckets on local disk.

Why: a table's first state is its whole batch reduced to one row per key. Held in memory at
once, that costs several times the batch (the benchmark's 1,250,000 changes peaked at 785 MiB,
and 40,000 rows of 16 KiB at 2.7 GiB, four times their WAL). Every change of a key hashes to
the same bucket, so each bucket reduces alone to the same rows the whole batch would: memory
follows the bucket (about ``BUCKET_BYTES``), not the run.

The buckets are Arrow IPC files (LZ4) in a folder of their own under ``PGLOGREPL_BUCKET_DIR``
(default: the system's temporary folder). Each piece is written and closed at once (no file
descriptor per bucket, and a bucket's space is freed as soon as it is reduced). The folder is
held by an ``flock`` while its split runs and removed after it; a run killed midway leaves its
folder, and the next split removes every such folder that no process holds and that is older
than a minute (a lock, unlike a pid, means the same in every container sharing the folder).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import BucketLostError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

log = logging.getLogger("airflow_pglogrepl.lake")

FOLDER_ENV = "PGLOGREPL_BUCKET_DIR"
# Arrow bytes of changes a bucket holds, about. Measured on the benchmark workload's first state
# (1,250,000 changes, drain_app's peak): 64 MiB buckets 603 MiB, 32 MiB 516 MiB, 16 MiB 496 MiB,
# at about the same speed (1.1 to 1.5 s), all faster than the whole batch in memory (2.8 s,
# 783 MiB)
BUCKET_BYTES = 32 << 20
MAX_BUCKETS = 512
# A bucket above this is not reduced here (a key with that many changes: every change of a key
# is in its bucket), nor is a batch that would fill MAX_BUCKETS buckets to it.
MAX_BUCKET_BYTES = 4 * BUCKET_BYTES
_PREFIX = "pglogrepl-buckets-"
_LOCK = ".lock"
_SWEEP_AGE_S = 60.0  # a folder younger than this is never swept: its split may be starting
HASH_CHUNK_BYTES = 1 << 20
_NULL_HASH = 0x9E3779B97F4A7C15  # every NULL key hashes alike (they group together)


def folder_base() -> Path:
    """Where bucket folders go: ``PGLOGREPL_BUCKET_DIR``, else the system's temporary folder."""
    return Path(os.environ.get(FOLDER_ENV) or tempfile.gettempdir())


def free_bytes() -> int:
    """Free bytes where bucket folders go (0 when the folder cannot be made)."""
    base = folder_base()
    try:
        base.mkdir(parents=True, exist_ok=True)
        return int(shutil.disk_usage(base).free)
    except OSError:
        return 0


def bucket_count(size_bytes: int) -> int:
    """Buckets for a batch of ``size_bytes`` Arrow bytes: about ``BUCKET_BYTES`` each."""
    return max(2, min(MAX_BUCKETS, -(-size_bytes // BUCKET_BYTES)))


def can_hash(kind: pa.DataType) -> bool:
    """Whether keys of this Arrow type hash here (equal keys, equal hashes)."""
    import pyarrow as pa

    t = pa.types
    return bool(
        t.is_integer(kind) or t.is_boolean(kind) or t.is_string(kind)
        or t.is_large_string(kind) or t.is_binary(kind) or t.is_large_binary(kind)
        or t.is_fixed_size_binary(kind) or t.is_decimal(kind)
        or (t.is_temporal(kind) and not t.is_interval(kind))
    )  # fmt: skip


def key_hash(batch: pa.Table | pa.RecordBatch, keys: Sequence[str]) -> np.ndarray[Any, Any]:
    """A uint64 hash of each row's key columns: equal keys (NULLs included) hash alike."""
    import numpy as np

    combined = np.zeros(batch.num_rows, dtype=np.uint64)
    for key in keys:
        combined = combined * np.uint64(0x100000001B3) ^ _column_hash(batch.column(key))
    return combined


def _column_hash(column: Any) -> np.ndarray[Any, Any]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    if pa.types.is_decimal(kind):
        column, kind = pc.cast(column, pa.string()), pa.string()
    if pa.types.is_boolean(kind):
        column, kind = pc.cast(column, pa.int8()), pa.int8()
    if pa.types.is_temporal(kind):
        width = pa.int32() if kind.bit_width == 32 else pa.int64()
        column, kind = column.view(width), width
    if pa.types.is_integer(kind):
        raw = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        hashed = _mix(raw.view(np.uint64))
    else:
        binary = pc.cast(column, pa.large_binary())
        # in chunks of about HASH_CHUNK_BYTES of values: the hash holds 48 bytes per value byte
        chunk = max(1, HASH_CHUNK_BYTES * max(1, len(binary)) // max(1, binary.nbytes))
        hashed = np.concatenate(
            [_mix(_bytes_hash(binary.slice(at, chunk))) for at in range(0, len(binary), chunk)]
            or [np.zeros(0, dtype=np.uint64)]
        )
    return np.where(valid, hashed, np.uint64(_NULL_HASH))


_BASE = 0x100000001B3  # odd: it has an inverse modulo 2**64
_BASE_INVERSE = pow(_BASE, -1, 1 << 64)


def _bytes_hash(column: Any) -> np.ndarray[Any, Any]:
    """A polynomial hash of each value's bytes, modulo 2**64, for all values at once: prefix sums
    of ``byte * BASE**i`` over the column's data buffer, each value's span divided by the power
    where it starts (equal bytes, wherever they lie in the buffer, hash alike)."""
    import numpy as np

    rows = len(column)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64, count=rows + 1,
                            offset=column.offset * 8)  # fmt: skip
    first, last = int(offsets[0]), int(offsets[-1])
    buffer = column.buffers()[2]
    data = np.frombuffer(buffer if buffer is not None else b"", dtype=np.uint8)[first:last]
    symbols = data.astype(np.uint64) + np.uint64(1)  # a zero byte still counts
    count = len(symbols)
    powers = np.cumprod(np.full(count, _BASE, dtype=np.uint64))  # BASE**(i+1)
    prefix = np.zeros(count + 1, dtype=np.uint64)
    np.cumsum(symbols * powers, out=prefix[1:])
    inverse = np.ones(count + 1, dtype=np.uint64)
    inverse[1:] = np.cumprod(np.full(count, _BASE_INVERSE, dtype=np.uint64))
    starts, ends = offsets[:-1] - first, offsets[1:] - first
    spans = (prefix[ends] - prefix[starts]) * inverse[starts]
    return spans ^ (ends - starts).astype(np.uint64) * np.uint64(0x9E3779B1)


def _mix(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Spread a hash's bits (splitmix64's finalizer), so that a modulus of it is uniform."""
    import numpy as np

    x = values.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


class Buckets:
    """The bucket folder of one split: ``add`` spreads batches over ``count`` buckets by key
    hash, ``take`` reads one bucket back whole and frees its files. Use as a context manager:
    the folder is held while it is open and removed when it closes."""

    def __init__(self, count: int, keys: Sequence[str]) -> None:
        self.count, self.keys = count, list(keys)
        self.folder: Path | None = None
        self._lock: int | None = None
        self._pieces = 0
        self._rows = [0] * count  # rows written to each bucket: checked when it is read back
        self._bytes = [0] * count

    def rows(self) -> int:
        """Rows written into all buckets."""
        return sum(self._rows)

    def written_bytes(self) -> int:
        """Arrow bytes written into all buckets (their files hold about as much, or less)."""
        return sum(self._bytes)

    def largest_bytes(self) -> int:
        """Arrow bytes written into the biggest bucket."""
        return max(self._bytes, default=0)

    def __enter__(self) -> Buckets:
        base = folder_base()
        base.mkdir(parents=True, exist_ok=True)
        _sweep(base)
        self.folder = base / f"{_PREFIX}{uuid.uuid4().hex}"
        self.folder.mkdir()
        self._lock = os.open(self.folder / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:  # fmt: skip
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Write ``batch``'s rows into their buckets, one closed file per bucket touched."""
        import numpy as np
        import pyarrow as pa

        assert self.folder is not None, "Buckets is used as a context manager"
        if batch.num_rows == 0:
            return
        bucket = (key_hash(batch, self.keys) % np.uint64(self.count)).astype(np.int64)
        order = np.argsort(bucket, kind="stable")
        counts = np.bincount(bucket, minlength=self.count)
        spread = batch.take(pa.array(order))
        at = 0
        options = pa.ipc.IpcWriteOptions(compression="lz4")
        for k, rows in enumerate(counts.tolist()):
            if rows:
                piece = spread.slice(at, rows)
                path = self.folder / f"{k}.{self._pieces}.arrow"
                with (
                    pa.OSFile(str(path), "wb") as sink,
                    pa.ipc.new_stream(sink, piece.schema, options=options) as writer,
                ):
                    writer.write(piece)
                self._rows[k] += rows
                self._bytes[k] += piece.nbytes
                at += rows
        self._pieces += 1
        os.utime(self.folder)  # in use: never old enough to be swept

    def take(self, k: int) -> pa.Table | None:
        """Bucket ``k``'s rows (None: none was written to it), its files removed once read;
        ``BucketLostError`` when fewer rows come back than were written (files removed under
        the split: by a cleaner of temporary files, or a sweep on a share without locks)."""
        import pyarrow as pa

        assert self.folder is not None, "Buckets is used as a context manager"
        if self._rows[k] == 0:
            return None
        paths = sorted(self.folder.glob(f"{k}.*.arrow"), key=lambda p: int(p.name.split(".")[1]))
        parts = []
        for path in paths:
            with pa.memory_map(str(path)) as source:
                parts.append(pa.ipc.open_stream(source).read_all())
        rows = pa.concat_tables(parts) if parts else None
        found = 0 if rows is None else rows.num_rows
        if found != self._rows[k]:
            raise BucketLostError(str(self.folder), k, self._rows[k], found, FOLDER_ENV)
        for path in paths:
            path.unlink()
        os.utime(self.folder)
        return rows


def _sweep(base: Path) -> None:
    """Remove the bucket folders of killed splits: older than a minute and held by no one."""
    now = time.time()
    for folder in base.glob(f"{_PREFIX}*"):
        try:
            if now - folder.stat().st_mtime < _SWEEP_AGE_S:
                continue
            lock = os.open(folder / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            continue  # a split is running in it
        try:
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s, the bucket folder of a split that did not finish", folder)
        finally:
            os.close(lock)
