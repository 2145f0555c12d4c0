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
