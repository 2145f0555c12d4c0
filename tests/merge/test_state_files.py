"""A state's new files written batch by batch (``merge.state_files``): closed at the file bound,
removed when the write fails before a commit was tried, kept once one was (it may have landed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_pglogrepl.lake import delta, row_groups
from airflow_pglogrepl.merge import state_files
from airflow_pglogrepl.merge.state_files import StateFiles

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def rows(n: int, at: int = 0) -> pa.Table:
    return pa.table({"id": range(at, at + n), "v": ["x" * 100] * n}, schema=SCHEMA)


def test_files_close_at_their_bound_and_row_groups_at_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_files, "FILE_ROWS", 250)
    monkeypatch.setattr(row_groups, "ROW_GROUP_BYTES", 2_000)
    committed: list[delta.DataFile] = []
    with StateFiles(str(tmp_path / "t"), SCHEMA, "0001") as files:
        for at in range(0, 1000, 100):
            files.write(rows(100, at))
        assert files.commit(committed.extend) == 1000
    assert [f.rows for f in committed] == [300, 300, 300, 100]
    first = pq.ParquetFile(tmp_path / "t" / committed[0].name)
    assert first.metadata.num_row_groups > 1  # no row group above the bound
    assert sorted(pq.read_table(tmp_path / "t").column("id").to_pylist()) == list(range(1000))


def test_a_write_that_fails_before_its_commit_removes_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_files, "FILE_ROWS", 50)
    with pytest.raises(RuntimeError), StateFiles(str(tmp_path / "t"), SCHEMA, "0001") as files:
        files.write(rows(120))
        raise RuntimeError("a read of the changelog failed")
    assert list((tmp_path / "t").iterdir()) == []


def test_files_stay_once_a_commit_was_tried(tmp_path: Path) -> None:
    """A commit that raised may have landed (its log entry written, its answer lost): removing
    the files then would leave a table whose log names missing files."""

    def landed_then_raised(files: list[delta.DataFile]) -> None:
        raise OSError("the store's answer was lost")

    with pytest.raises(OSError), StateFiles(str(tmp_path / "t"), SCHEMA, "0001") as files:
        files.write(rows(10))
        files.commit(landed_then_raised)
    assert len(list((tmp_path / "t").iterdir())) == 1


def test_rows_of_uneven_sizes_are_cut_into_row_groups_by_their_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many small rows and a few big ones: no row group above the bound (a row group sized by
    the average row held all the big ones)."""
    monkeypatch.setattr(row_groups, "ROW_GROUP_BYTES", 50_000)
    uneven = pa.table({"id": range(2010), "v": ["x"] * 2000 + ["y" * 16_000] * 10}, schema=SCHEMA)
    committed: list[delta.DataFile] = []
    with StateFiles(str(tmp_path / "t"), SCHEMA, "0001") as files:
        files.write(uneven)
        files.commit(committed.extend)
    metadata = pq.ParquetFile(tmp_path / "t" / committed[0].name).metadata
    read = pq.ParquetFile(tmp_path / "t" / committed[0].name)
    for i in range(metadata.num_row_groups):
        assert read.read_row_group(i).nbytes <= 50_000 or metadata.row_group(i).num_rows == 1
    assert read.read().column("id").to_pylist() == list(range(2010))


def test_a_file_whose_close_fails_is_removed_with_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_pglogrepl.lake import durability

    def full_disk(path: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durability, "fsync", full_disk)
    with (
        pytest.raises(OSError, match="No space"),
        StateFiles(str(tmp_path / "t"), SCHEMA, "0001") as files,
    ):
        files.write(rows(10))
        files.commit(lambda written: None)
    assert list((tmp_path / "t").iterdir()) == []
