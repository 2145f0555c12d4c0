"""A first state too big for memory (``merge.first_state``): split by key hash into buckets on
local disk, each reduced alone and written as it is reduced, one commit; an update with no row
to keep its unchanged values from fails as in memory, leaving nothing; a key with more changes
than a bucket holds goes to Spark."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake.delta import txn_version
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.merge import changes_range, first_state
from tests.merge.test_arrow import Log, Model, T, commit, play, state


@pytest.mark.parametrize("seed", range(8))
def test_a_first_state_too_big_for_memory_is_reduced_bucket_by_bucket(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the in-memory bounds a first state goes through key-hash buckets on local disk,
    read in small batches and written into several files: the same rows as the model, one
    commit, and no bucket folder left behind."""
    from deltalake import DeltaTable

    from airflow_pglogrepl.merge import buckets, state_files

    monkeypatch.setattr(arrow_merge, "IN_MEMORY_ROWS", 5)
    monkeypatch.setattr(changes_range, "BATCH_BYTES", 200)  # a few rows a batch
    monkeypatch.setattr(buckets, "BUCKET_BYTES", 300)
    monkeypatch.setattr(state_files, "FILE_ROWS", 3)
    monkeypatch.setenv(buckets.FOLDER_ENV, str(tmp_path / "buckets"))
    rng = random.Random(seed)
    lake = Lake(str(tmp_path / "lake"), "s")
    model: Model = {}
    log = Log(0x100)
    play(rng, model, log, 80)
    end = commit(lake, log, 0x100)
    assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": str(end)}, [])
    assert state(lake) == model
    table = DeltaTable(lake.paths.state(T))
    assert table.version() == 0 and table.transaction_version(lake.app) == int(end)
    assert 1 < len(table.file_uris()) <= -(-len(model) // 3)  # files closed at 3 rows or more
    assert list((tmp_path / "buckets").iterdir()) == []


def test_a_first_state_in_buckets_refuses_an_unchanged_value_with_no_row_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bucket path fails as the in-memory one does on an update whose unchanged TOAST value
    has no earlier row, and the files it had written for other buckets are removed."""
    from airflow_pglogrepl.merge import buckets

    monkeypatch.setattr(arrow_merge, "IN_MEMORY_ROWS", 1)
    monkeypatch.setattr(buckets, "BUCKET_BYTES", 100)
    monkeypatch.setenv(buckets.FOLDER_ENV, str(tmp_path / "buckets"))
    lake = Lake(str(tmp_path / "lake"), "s")
    log = Log(0x100)
    for key in range(40):
        log.add("I", key, key, "a")
    log.add("U", 99, 1, None, unchanged=("big",))
    end = commit(lake, log, 0x100)
    with pytest.raises(LakeError, match="row 99 is neither in the state"):
        arrow_merge.merge_table(lake, "public.t", end)
    assert txn_version(lake.paths.state(T), lake.app) is None
    state_dir = Path(lake.paths.state(T))
    assert not state_dir.exists() or list(state_dir.rglob("*.parquet")) == []
    assert list((tmp_path / "buckets").iterdir()) == []


def test_a_key_with_more_changes_than_a_bucket_holds_goes_to_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every change of a key is in its bucket: a hot key makes one bucket as big as the batch,
    which is not reduced here (memory would follow the key, not the bucket)."""
    from airflow_pglogrepl.merge import buckets

    monkeypatch.setattr(arrow_merge, "IN_MEMORY_ROWS", 5)
    monkeypatch.setattr(first_state, "MAX_BUCKET_BYTES", 20_000)
    monkeypatch.setenv(buckets.FOLDER_ENV, str(tmp_path / "buckets"))
    lake = Lake(str(tmp_path / "lake"), "s")
    log = Log(0x100)
    log.add("I", 1, 0, "a")
    for n in range(200):
        log.add("U", 1, n, "x" * 200)
    end = commit(lake, log, 0x100)
    why = arrow_merge.merge_table(lake, "public.t", end)
    assert why is not None and "a bucket of" in why and "a key with that many changes" in why
    assert txn_version(lake.paths.state(T), lake.app) is None
    assert list((tmp_path / "buckets").iterdir()) == []
