"""A changelog's range read without a JVM (``merge.changes_range``): counted once, read whole or
in batches bounded by bytes (uneven rows cut again), every row of the range exactly once, and
sized before a row is read close to what it holds."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge import changes_range
from airflow_pglogrepl.merge.changes_range import InRange
from airflow_pglogrepl.tables import TableRef
from tests.support.keyed import KeyedBatches

T = TableRef("public", "t")


@pytest.fixture
def batches(tmp_path: Path) -> KeyedBatches:
    return KeyedBatches(Lake(str(tmp_path / "lake"), "s"), T)


def in_range(batches: KeyedBatches, have: int | None, end: int) -> InRange:
    changes = DeltaTable(batches.lake.paths.changes(T))
    return InRange(changes, delta.schema_of(changes), have, end)


def test_the_range_is_counted_and_read_whole_or_in_batches_alike(
    batches: KeyedBatches, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = batches.inserts(range(1, 301))
    end = batches.updates_and_deletes(range(1, 301, 2), "u")
    monkeypatch.setattr(changes_range, "BATCH_BYTES", 100)
    later = in_range(batches, int(first), int(end))
    whole = later.read(["id", "_op"])
    assert later.count() == whole.num_rows > 10
    parts = list(later.batches(["id", "_op"]))
    assert len(parts) > 1 and all(p.nbytes <= 100 or p.num_rows == 1 for p in parts)
    assert pa.concat_tables(parts).sort_by("id").equals(whole.sort_by("id"))
    assert later.seen_rows == whole.num_rows
    assert later.seen_bytes == sum(p.nbytes for p in parts)
    assert in_range(batches, None, int(end)).count() == 300 + whole.num_rows


def test_the_size_before_the_read_is_close_to_what_is_read(batches: KeyedBatches) -> None:
    end = batches.inserts(range(1, 5001))
    rows = in_range(batches, None, int(end))
    size = rows.size_bytes(["id", "v"])
    held = rows.read(["id", "v"]).nbytes
    assert held // 2 <= size <= held * 2
