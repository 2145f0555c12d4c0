"""The Delta log operations without a JVM: commits are compare-and-set on the app transaction
version, and the tables the lake creates leave log cleanup to the upkeep (what a commit depends
on is fsynced: tests/lake/test_durability.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake import delta
from tests.support.lake_batches import DELTA_APP, commit_ids

APP = DELTA_APP


def _ids(uri: str) -> list[int]:
    return sorted(delta.read_table(uri).column("id").to_pylist())


def test_a_commit_whose_version_does_not_go_forward_is_refused(tmp_path: Path) -> None:
    """Before: delta-rs committed version 100, then 50, and the table reported 50."""
    uri = str(tmp_path / "t")
    commit_ids(uri, 100, None, 1)
    for lower in (50, 100):
        with pytest.raises(LakeCommitConflictError, match=r"versions only go forward"):
            commit_ids(uri, lower, 100, 2)
    assert delta.txn_version(uri, APP) == 100 and _ids(uri) == [1]


def test_a_commit_against_a_version_another_writer_moved_is_refused(tmp_path: Path) -> None:
    """A writer filters its rows against the version it read; if another committed since, its
    rows may be the other's too: refused, whatever version it carries."""
    uri = str(tmp_path / "t")
    commit_ids(uri, 0x100, None, 1)
    commit_ids(uri, 0x200, 0x100, 2)  # the other writer
    with pytest.raises(LakeCommitConflictError, match=r"another writer committed there since"):
        commit_ids(uri, 0x300, 0x100, 2, 3)  # the stale one, with a higher version
    with pytest.raises(LakeCommitConflictError, match=r"another writer"):
        commit_ids(str(tmp_path / "t"), 0x300, None, 2, 3)  # believed the table new
    assert _ids(uri) == [1, 2]
    other = str(tmp_path / "new")
    with pytest.raises(LakeCommitConflictError):  # believed it held something: no table
        commit_ids(other, 0x100, 0x50, 1)
    assert delta.open_table(other) is None


def test_the_check_and_the_commit_are_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit lands between the version read and the commit: delta-rs refuses a commit made
    on a snapshot older than a commit of the same app id, and that is a conflict too."""
    uri = str(tmp_path / "t")
    commit_ids(uri, 0x100, None, 1)
    stale = delta.open_table(uri)  # read before the other writer's commit
    commit_ids(uri, 0x200, 0x100, 2)
    monkeypatch.setattr(delta, "open_table", lambda _: stale)
    with pytest.raises(LakeCommitConflictError, match=r"another writer"):
        commit_ids(uri, 0x300, 0x100, 3)
    monkeypatch.undo()
    assert _ids(uri) == [1, 2] and delta.txn_version(uri, APP) == 0x200


def test_every_table_the_lake_creates_leaves_log_cleanup_to_the_upkeep(tmp_path: Path) -> None:
    """Writers clean expired log entries when they checkpoint, whatever positions a user asked
    to keep; the lake's tables turn that off, and only the upkeep cleans, after its check."""
    from deltalake import DeltaTable

    from airflow_pglogrepl.changelog.columns import COMMIT_LSN, KEY_META, OLD, OP, SEQ, UNCHANGED
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lake.window import Window
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.merge import arrow as arrow_merge
    from airflow_pglogrepl.tables import TableRef

    lake = Lake(str(tmp_path / "lake"), "s")
    table = TableRef("public", "t")
    schema = pa.schema([pa.field("id", pa.int64(), metadata={KEY_META: "0"}),
                        pa.field(OP, pa.string()), pa.field(COMMIT_LSN, pa.int64()),
                        pa.field(SEQ, pa.int64()), pa.field(UNCHANGED, pa.list_(pa.string())),
                        pa.field(OLD, pa.struct([pa.field("id", pa.int64())]))])  # fmt: skip
    window = Window(lake, LSN(0x100))
    window.write(table, pa.Table.from_pylist([{"id": 1, OP: "I", COMMIT_LSN: 0x150, SEQ: 0}],
                                             schema=schema))  # fmt: skip
    window.commit(LSN(0x200), transactions=1, changes=1)
    assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": "0/200"}, [])
    for uri in (lake.paths.changes(table), lake.paths.state(table), lake.paths.windows()):
        config = DeltaTable(uri).metadata().configuration
        assert config.get("delta.enableExpiredLogCleanup") == "false", uri
