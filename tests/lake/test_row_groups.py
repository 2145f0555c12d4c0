"""Row groups cut by bytes (``lake.row_groups``): uneven rows are cut where they are big, small
neighbours joined again, every row kept in order; a changelog file the lake writes has no row
group above the bound."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_pglogrepl.lake import delta, row_groups
from airflow_pglogrepl.lake.row_groups import pieces


def test_uneven_rows_are_cut_by_their_bytes_and_kept_in_order() -> None:
    rows = pa.table({"v": ["x" * 16_000] * 10 + ["y"] * 100_000})
    cut = list(pieces(rows, 100_000))
    assert all(p.nbytes <= 100_000 or p.num_rows == 1 for p in cut)
    assert pa.concat_tables(cut).equals(rows)
    assert len(cut) < 12  # small neighbours joined again, not one piece per halving


def test_rows_that_fit_are_one_piece_and_none_are_none() -> None:
    rows = pa.table({"a": list(range(10))})
    assert [p.num_rows for p in pieces(rows, 1 << 30)] == [10]
    assert list(pieces(rows.slice(0, 0), 10)) == []
    assert [p.num_rows for p in pieces(pa.table({"v": ["z" * 500]}), 10)] == [1]


def test_a_file_the_lake_writes_has_no_row_group_above_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(row_groups, "ROW_GROUP_BYTES", 50_000)
    rows = pa.table({"id": list(range(2010)), "v": ["x"] * 2000 + ["y" * 16_000] * 10})
    written = delta.write_file(str(tmp_path / "t"), rows, prefix="0001")
    read = pq.ParquetFile(tmp_path / "t" / written.name)
    assert read.metadata.num_row_groups > 1
    for i in range(read.metadata.num_row_groups):
        group = read.read_row_group(i)
        assert group.nbytes <= 50_000 or group.num_rows == 1
    assert read.read().equals(rows)
