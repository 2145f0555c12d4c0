"""A history's commits: compare-and-set on its position, the state version each one saw."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import history_writes as writes
from airflow_pglogrepl.merge.history import merge_history
from airflow_pglogrepl.merge.history_changes import TableChanges
from airflow_pglogrepl.merge.history_versions import versions
from tests.merge.test_history import NAME, T, window

SEEN = {"pglogrepl.state_version": "4"}


def test_a_merge_read_against_another_position_commits_nothing(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])
    later = window(lake, int(end), [{"_op": "U", "id": 1, "v": 2}])
    table = TableChanges(delta.open_table(lake.paths.changes(T)))
    target = delta.open_table(lake.paths.history(T))
    made = versions(table.read(int(end), int(later)), table.columns, table.keys,
                    prior=lambda _: table.types.empty_table(), types=table.types)  # fmt: skip
    with pytest.raises(LakeCommitConflictError):
        writes.merge(lake, lake.paths.history(T), target, 0x50, later, made, table.types, SEEN)
    assert delta.open_table(lake.paths.history(T)).version() == target.version()
    writes.merge(lake, lake.paths.history(T), target, int(end), later, made, table.types, SEEN)
    done = delta.open_table(lake.paths.history(T))
    assert done.transaction_version(lake.app) == int(later)
    assert done.history(limit=1)[0]["pglogrepl.state_version"] == "4"


def test_a_position_is_recorded_with_no_rows_and_never_backwards(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])
    uri = lake.paths.history(T)
    stored = delta.schema_of(delta.open_table(uri))
    writes.record(lake, uri, stored, LSN(int(end) + 0x10), int(end), SEEN)
    assert delta.txn_version(uri, lake.app) == int(end) + 0x10
    with pytest.raises(LakeCommitConflictError):
        writes.record(lake, uri, stored, end, int(end) + 0x10, SEEN)


@pytest.mark.parametrize("renamed", ["big", "id"])
def test_a_column_renamed_at_the_source_is_renamed_in_every_version(
    tmp_path: Path, renamed: str
) -> None:
    """An unchanged TOAST value of the renamed column is still carried; a renamed key still
    ends its row's version (the changelog renames in place, the history rewrites its rows)."""
    import datetime

    import pyarrow as pa

    from airflow_pglogrepl.changelog.columns import IDENTITY_META, KEY_META
    from airflow_pglogrepl.lake.window import Window
    from tests.support.lake_batches import origins_stub

    def schema(names: dict[str, str]) -> pa.Schema:
        table = [pa.field(names["id"], pa.int64(), metadata={KEY_META: "0"}),
                 pa.field("v", pa.int64()), pa.field(names["big"], pa.string())]  # fmt: skip
        return pa.schema([*table, pa.field("_op", pa.string(), metadata={IDENTITY_META: "d"}),
                          pa.field("_commit_lsn", pa.int64()), pa.field("_seq", pa.int64()),
                          pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
                          pa.field("_unchanged", pa.list_(pa.string())),
                          pa.field("_old", pa.struct(table))])  # fmt: skip

    def commit(lake: Lake, start: int, row: dict[str, object], names: dict[str, str]) -> LSN:
        stamp = datetime.datetime.fromtimestamp(start, datetime.UTC)
        full = {names["big"]: None, "_unchanged": [], "_old": None, **row,
                "_commit_lsn": start + 0x10, "_seq": 0, "_commit_ts": stamp}  # fmt: skip
        window = Window(lake, LSN(start))
        window.write(T, pa.Table.from_pylist([full], schema=schema(names)))
        window.commit(LSN(start + 0x20), transactions=1, changes=1)
        return LSN(start + 0x20)

    attnums = {"id": 1, "v": 2, "big": 3, "payload": 3, "ident": 1}
    lake = Lake(str(tmp_path / "lake"), "s", origins=origins_stub(natts=3, attnums=attnums))
    old = {"id": "id", "big": "big"}
    end = commit(lake, 0x100, {"_op": "I", "id": 1, "v": 1, "big": "TOASTED"}, old)
    merge_history(lake, [NAME])
    new = dict(old, **{renamed: {"big": "payload", "id": "ident"}[renamed]})
    commit(lake, int(end), {"_op": "U", new["id"]: 1, "v": 5, "_unchanged": [new["big"]]}, new)
    merge_history(lake, [NAME])
    rows = delta.scan(lake.paths.history(T)).to_pylist()
    assert sorted(rows[0]) == sorted(delta.schema_of(delta.open_table(lake.paths.history(T))).names)
    assert new[renamed] in rows[0] and renamed not in rows[0]
    got = sorted((r[new["id"]], r["v"], r[new["big"]], r["_is_current"]) for r in rows)
    assert got == [(1, 1, "TOASTED", False), (1, 5, "TOASTED", True)]


def test_a_merge_writes_row_groups_of_the_lakes_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs' own groups are a million rows: 100 MiB of a wide history, which the next
    MERGE's reader holds whole. Its files here have groups of about ``ROW_GROUP_BYTES``."""
    import pyarrow.parquet as pq

    from airflow_pglogrepl.lake import row_groups

    lake = Lake(str(tmp_path / "lake"), "s")
    rows = [{"_op": "I", "id": i, "v": i, "big": "x" * 200} for i in range(3000)]
    end = window(lake, 0x100, rows)
    merge_history(lake, [NAME])
    monkeypatch.setattr(row_groups, "ROW_GROUP_BYTES", 64 << 10)  # about 250 of these rows
    window(lake, int(end) + 0x100000, [{"_op": "U", "id": i, "v": -i, "big": "y" * 200}
                                       for i in range(0, 3000, 2)])  # fmt: skip
    merge_history(lake, [NAME])
    table = delta.open_table(lake.paths.history(T))
    assert table.history(limit=1)[0]["operation"] == "MERGE"
    groups = [pq.ParquetFile(path).metadata
              for path in table.file_uris()]  # fmt: skip
    biggest = max(m.row_group(i).num_rows for m in groups for i in range(m.num_row_groups))
    assert 1024 <= biggest < 3000, biggest
