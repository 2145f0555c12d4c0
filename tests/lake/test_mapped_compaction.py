"""Compaction of a table under column mapping, which delta-rs refuses to compact itself
(``lake.mapped_compaction``), on real Delta tables: small files are packed into runs of about
the target size in one commit that changes no data (every row, the app transaction and the
statistics kept), made only after the writer lock is proven; nothing is committed with fewer
than two files to pack; a table not under mapping is refused; a file from before a column was
added reads NULL there, nested fields too, as Delta reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake import delta, mapped_compaction
from airflow_pglogrepl.lake.mapped_compaction import Packed, compact
from airflow_pglogrepl.lake.mapping import mapped_of, mapped_schema, to_physical

OLD = pa.struct([pa.field("sp ace", pa.int64()), pa.field("x", pa.string())])
SCHEMA = pa.schema([pa.field("sp ace", pa.int64()), pa.field("v", pa.string()),
                    pa.field("_old", OLD)])  # fmt: skip
APP = "airflow-pglogrepl/s"


def _rows(first: int, n: int) -> pa.Table:
    keys = list(range(first, first + n))
    old = [{"sp ace": k, "x": f"o{k}"} if k % 2 else None for k in keys]
    return pa.table([pa.array(keys, pa.int64()), pa.array([f"v{k}" for k in keys]),
                     pa.array(old, OLD)], schema=SCHEMA)  # fmt: skip


def _mapped_table(uri: str, files: int, rows: int = 10) -> None:
    """A mapped table of ``files`` files of ``rows`` rows each, one commit a file."""
    mapped = mapped_schema(SCHEMA, pinned=())
    for n in range(files):
        table = delta.open_table(uri)
        mapping = mapped if table is None else mapped_of(table)
        assert mapping is not None
        file = delta.write_file(uri, to_physical(_rows(n * rows, rows), mapping), f"w{n}")
        delta.commit_files(uri, SCHEMA, [file], app=APP, version=n + 1,
                           expected=None if n == 0 else n, mapping=mapped)  # fmt: skip


def _sorted(uri: str) -> list[dict[str, Any]]:
    return sorted(delta.read_table(uri).to_pylist(), key=lambda r: int(r["sp ace"]))


def _open(uri: str) -> Any:
    table = delta.open_table(uri)
    assert table is not None
    return table


def test_small_files_are_packed_into_runs_in_one_commit_that_changes_no_data(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    _mapped_table(uri, 6)
    before, table = _sorted(uri), _open(uri)
    size = max(delta.file_sizes(table))
    checks: list[int] = []

    packed = compact(uri, table, small_bytes=size + 1, target_bytes=3 * size,
                     check_writer=lambda: checks.append(1))  # fmt: skip

    assert packed == Packed(removed=6, added=2, left_with_vectors=0) and checks == [1]
    after = _open(uri)
    assert after.version() == 6 and len(delta.file_sizes(after)) == 2
    assert _sorted(uri) == before
    assert delta.txn_version(uri, APP) == 6
    commit = Path(uri, "_delta_log", f"{6:020d}.json").read_text().splitlines()
    actions = [json.loads(line) for line in commit]
    changed = [a[k] for a in actions for k in ("add", "remove") if k in a]
    assert len(changed) == 8 and not any(c["dataChange"] for c in changed)
    stats = [json.loads(a["add"]["stats"]) for a in actions if "add" in a]
    assert sorted(s["numRecords"] for s in stats) == [30, 30]


def test_a_lost_lock_commits_nothing(tmp_path: Path) -> None:
    from airflow_pglogrepl.exceptions import WriterLockLostError

    uri = str(tmp_path / "t")
    _mapped_table(uri, 3)
    before = _sorted(uri)

    def lost() -> None:
        raise WriterLockLostError("s", "the lock's session ended")

    with pytest.raises(WriterLockLostError):
        compact(uri, _open(uri), small_bytes=1 << 30, target_bytes=1 << 30, check_writer=lost)
    after = _open(uri)
    assert after.version() == 2 and len(delta.file_sizes(after)) == 3
    assert _sorted(uri) == before


def test_fewer_than_two_files_to_pack_commit_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _mapped_table(uri, 3)
    size = min(delta.file_sizes(_open(uri)))

    def never() -> None:
        raise AssertionError("the lock was checked for a commit that needs none")

    assert compact(uri, _open(uri), small_bytes=size, target_bytes=1 << 30,
                   check_writer=never) == Packed(0, 0, 0)  # none small  # fmt: skip
    assert compact(uri, _open(uri), small_bytes=1 << 30, target_bytes=1,
                   check_writer=never) == Packed(0, 0, 0)  # each alone in its run  # fmt: skip
    assert _open(uri).version() == 2


def test_a_table_not_under_mapping_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "plain")
    delta.commit_files(uri, SCHEMA, [delta.write_file(uri, _rows(0, 2), "w")], app=APP,
                       version=1, expected=None)  # fmt: skip
    with pytest.raises(ValueError, match=r"plain is not under column mapping: delta-rs compacts"):
        compact(uri, _open(uri), small_bytes=1 << 30, target_bytes=1 << 30, check_writer=list)


@pytest.mark.parametrize(
    ("sizes", "target", "runs"),
    [([5, 5, 5, 5], 10, [[5, 5], [5, 5]]), ([3, 9, 2], 10, [[3], [9], [2]]),
     ([20, 1, 1], 10, [[20], [1, 1]]), ([4, 4, 4], 12, [[4, 4, 4]]), ([], 10, [])],
)  # fmt: skip
def test_files_are_cut_in_order_into_runs_of_at_most_the_target(
    sizes: list[int], target: int, runs: list[list[int]]
) -> None:
    files = [(f"f{i}", s) for i, s in enumerate(sizes)]
    found = mapped_compaction._bins(files, target)
    assert [[s for _, s in run] for run in found] == runs
    assert [p for run in found for p, _ in run] == [p for p, _ in files]


def test_a_file_from_before_a_column_was_added_reads_null_there() -> None:
    """Nested fields too, a NULL struct staying NULL, and each column read as the table's type."""
    wide = pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.string())])
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", wide),
                        pa.field("added", pa.string())])  # fmt: skip
    narrow = pa.struct([pa.field("a", pa.int32())])
    old = pa.table({"id": pa.array([1, 2, 3], pa.int32()),
                    "s": pa.array([{"a": 1}, None, {"a": 3}], narrow)}).slice(1)  # fmt: skip
    found = mapped_compaction._as(schema, old)
    assert found.schema == schema
    assert found.to_pylist() == [
        {"id": 2, "s": None, "added": None},
        {"id": 3, "s": {"a": 3, "b": None}, "added": None},
    ]
