"""Key-hash buckets on local disk (``merge.buckets``): equal keys hash alike whatever their type
and wherever they sit in a batch, NULL keys group together, a bucket is read back whole and its
files freed, and a killed split's folder is swept only when no split holds it and it is older
than a minute."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.merge import buckets
from airflow_pglogrepl.merge.buckets import Buckets, can_hash, key_hash


@pytest.mark.parametrize(
    "kind, values",
    [
        (pa.int64(), [5, None, 7, 5, None]),
        (pa.string(), ["k", None, "other", "k", None]),
        (pa.large_string(), ["", None, "\0", "", None]),
        (pa.binary(16), [b"a" * 16, None, b"b" * 16, b"a" * 16, None]),
        (pa.decimal128(10, 2), [1, None, 2, 1, None]),
        (pa.timestamp("us", "UTC"), [1, None, 2, 1, None]),
        (pa.date32(), [1, None, 2, 1, None]),
        (pa.bool_(), [True, None, False, True, None]),
    ],
)
def test_equal_keys_hash_alike_and_nulls_group_together(kind: pa.DataType, values: list) -> None:
    column = pa.array(values, kind)
    assert can_hash(kind)
    whole = key_hash(pa.table({"k": column}), ["k"])
    assert whole[0] == whole[3] and whole[1] == whole[4] and whole[0] != whole[2]
    sliced = key_hash(pa.table({"k": column.slice(2)}), ["k"])  # offsets into one buffer
    assert list(sliced) == list(whole[2:])


def test_keys_of_several_columns_hash_by_all_of_them() -> None:
    table = pa.table({"a": ["x", "x", "y"], "b": [1, 2, 1]})
    hashed = key_hash(table, ["a", "b"])
    assert len(set(hashed.tolist())) == 3


def test_types_that_cannot_be_hashed_are_said_so() -> None:
    assert not can_hash(pa.month_day_nano_interval())
    assert not can_hash(pa.list_(pa.int64()))
    assert not can_hash(pa.float64())


def test_a_bucket_is_read_back_whole_and_its_files_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(buckets.FOLDER_ENV, str(tmp_path))
    table = pa.table({"k": list(range(100)), "v": [str(i) for i in range(100)]})
    with Buckets(4, ["k"]) as split:
        split.add(table.slice(0, 60))
        split.add(table.slice(60))
        assert split.folder is not None
        seen = []
        for k in range(4):
            part = split.take(k)
            assert part is not None
            assert not list(split.folder.glob(f"{k}.*.arrow"))  # freed once read
            seen += part.column("k").to_pylist()
        assert sorted(seen) == list(range(100))
        folder = split.folder
    assert not folder.exists()


def test_a_killed_splits_folder_is_swept_only_when_unheld_and_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(buckets.FOLDER_ENV, str(tmp_path))
    old = time.time() - 600
    dead = tmp_path / "pglogrepl-buckets-dead"
    held = tmp_path / "pglogrepl-buckets-held"
    young = tmp_path / "pglogrepl-buckets-young"
    for folder in (dead, held, young):
        folder.mkdir()
        (folder / "0.0.arrow").write_bytes(b"x")
    for folder in (dead, held):
        os.utime(folder, (old, old))
    lock = os.open(held / ".lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a split running in it (any process, any container)
    try:
        with Buckets(2, ["k"]):
            pass
        assert not dead.exists()
        assert held.exists() and young.exists()
    finally:
        os.close(lock)


def test_a_bucket_whose_files_vanished_fails_instead_of_losing_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner of temporary files (or a sweep on a share without working locks) removing a
    bucket's files mid-split must not make a state without those keys."""
    monkeypatch.setenv(buckets.FOLDER_ENV, str(tmp_path))
    with Buckets(4, ["k"]) as split:
        split.add(pa.table({"k": list(range(100))}))
        assert split.rows() == 100
        assert split.folder is not None
        for path in split.folder.glob("1.*.arrow"):
            path.unlink()
        assert split.take(0) is not None
        with pytest.raises(buckets.BucketLostError, match=r"bucket 1 .* read back 0 of the"):
            split.take(1)


def test_text_keys_hash_alike_in_chunks_of_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long text keys are hashed in chunks of rows (the hash holds 48 bytes per key byte): the
    hashes do not depend on where the chunks fall."""
    table = pa.table({"k": [f"/a/path/{i}/" * (i % 7) for i in range(2000)] + [None]})
    whole = key_hash(table, ["k"])
    monkeypatch.setattr(buckets, "HASH_CHUNK_BYTES", 100)
    assert list(key_hash(table, ["k"])) == list(whole)
