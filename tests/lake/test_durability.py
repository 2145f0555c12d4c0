"""A commit the lake made outlives a power cut: every new log entry and every directory that
gained an entry is fsynced; a log entry the lake writes itself is put whole, and only where
none is."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake import delta, durability
from tests.support.lake_batches import commit_ids, id_rows


def test_every_new_log_entry_and_new_directory_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: only the two newest log entries were fsynced, while a schema evolution makes
    several commits in a row, and the directory that gained a new table never was."""
    synced: list[str] = []
    real = durability.fsync
    monkeypatch.setattr(durability, "fsync", lambda path: (synced.append(path), real(path)))
    root = tmp_path / "lake"
    uri = str(root / "changes" / "public.t")
    commit_ids(uri, 0x100, None, 1)
    assert {str(root / "changes"), str(root)} <= set(synced)  # the new table's parents
    synced.clear()
    wider = pa.schema(
        [
            *(f.with_metadata({"k": f.name}) for f in id_rows(1).schema),
            pa.field("c", pa.int64(), metadata={"k": "c"}),
        ]
    )
    delta.evolve_schema(uri, wider)  # a commit adding the column, then one per changed metadata
    log_dir = Path(uri, "_delta_log")
    entries = sorted(p.name for p in log_dir.glob("*.json"))
    assert len(entries) >= 4
    new = {str(log_dir / name) for name in entries[1:]}
    assert new <= set(synced), sorted(new - set(synced))
    assert str(log_dir / entries[0]) not in synced  # what an earlier commit made durable
    assert os.path.realpath(uri) in {os.path.realpath(p) for p in synced}


def test_a_log_entry_is_put_only_where_none_is(tmp_path: Path) -> None:
    """A writer that stalled after it chose a version finds it taken: the entry another writer
    put stays as it was, and no temporary file is left beside it."""
    uri = str(tmp_path / "t")
    assert durability.put_first_commit(uri, b"first\n")
    assert not durability.put_commit(uri, 0, b"second\n")
    log_dir = Path(uri, "_delta_log")
    assert (log_dir / durability.FIRST_COMMIT).read_bytes() == b"first\n"
    assert sorted(os.listdir(log_dir)) == [durability.FIRST_COMMIT]
