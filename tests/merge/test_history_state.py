"""Where a history begins, and begins again when the state is replaced from a copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.history_columns import (
    ENDED_BY,
    IS_CURRENT,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO_LSN,
)
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge.history import history_position, merge_history
from airflow_pglogrepl.merge.history_state import STATE_VERSION, seen_state_version
from tests.merge.test_history import NAME, T, window


def replace_state(lake: Lake, rows: list[dict[str, Any]], at: int, *, marked: bool) -> None:
    """A state written whole at ``at``: from a copy of the source (``marked``, as a re-snapshot
    or a backfill writes it), or as a merge would."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    table = pa.Table.from_pylist(rows, schema=pa.schema(
        [("id", pa.int64()), ("v", pa.int64()), ("big", pa.string())]))  # fmt: skip
    metadata = {"userMetadata": delta.REWRITTEN} if marked else None
    commit = CommitProperties(app_transactions=[Transaction(lake.app, at)],
                              custom_metadata=metadata)  # fmt: skip
    write_deltalake(lake.paths.state(T), table, mode="overwrite", commit_properties=commit)


def versions(lake: Lake) -> list[tuple[Any, ...]]:
    rows = delta.scan(lake.paths.history(T)).to_pylist()
    return sorted(((r["id"], r["v"], r[VALID_FROM_LSN], r[VALID_FROM_SEQ], r[VALID_TO_LSN],
                    r[ENDED_BY], r[IS_CURRENT]) for r in rows), key=repr)  # fmt: skip


@pytest.mark.parametrize("root", ["lake", "lake of späce"])  # (a table's own URI is %-encoded)
def test_a_copy_of_the_source_ends_every_current_version_and_begins_its_rows(
    tmp_path: Path, root: str
) -> None:
    lake = Lake(str(tmp_path / root), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}, {"_op": "I", "id": 2, "v": 2}])
    merge_history(lake, [NAME])
    # A re-snapshot at C: the changelog lacks what happened between (row 2 gone, row 3 made
    # by an attached partition), the copy holds it.
    copied = int(end) + 0x100
    later = window(lake, int(end), [{"_op": "U", "id": 1, "v": 5}])
    replace_state(lake, [{"id": 1, "v": 5, "big": "b"}, {"id": 3, "v": 3, "big": None}], copied,
                  marked=True)  # fmt: skip
    after = window(lake, copied, [{"_op": "U", "id": 3, "v": 4, "_unchanged": ["big"]}])
    assert merge_history(lake, [NAME]) == {NAME: str(after)}
    a, c = int(end), copied
    assert versions(lake) == sorted([
        (1, 1, 0x110, 0, a + 0x10, "update", False),
        (1, 5, a + 0x10, 0, c, "resync", False),  # (its later change came before the copy)
        (1, 5, c, -2, None, None, True),
        (2, 2, 0x120, 0, c, "resync", False),  # gone by the copy: when is not known
        (3, 3, c, -1, c + 0x10, "update", False),
        (3, 4, c + 0x10, 0, None, None, True),
    ], key=repr)  # fmt: skip
    assert int(later) < copied
    # taken once: a run after it has nothing to begin again
    table = delta.open_table(lake.paths.history(T))
    assert (
        seen_state_version(table, lake.paths.history(T))
        == delta.open_table(lake.paths.state(T)).version()
    )
    before = versions(lake)
    merge_history(lake, [NAME])
    assert versions(lake) == before


def test_a_state_merged_whole_is_no_copy(tmp_path: Path) -> None:
    """An overwrite a merge makes (a batch that truncated the table) says nothing of a copy:
    the history goes on from the changelog alone."""
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])
    later = window(lake, int(end), [{"_op": "T"}, {"_op": "I", "id": 2, "v": 2}])
    replace_state(lake, [{"id": 2, "v": 2, "big": None}], int(later), marked=False)
    merge_history(lake, [NAME])
    assert [(r[0], r[5]) for r in versions(lake)] == [(1, "truncate"), (2, None)]


def test_every_history_commit_records_the_state_version_it_saw(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])  # no state at all: whatever makes one comes after
    table = delta.open_table(lake.paths.history(T))
    assert table.history(limit=1)[0][STATE_VERSION] == "-1"
    replace_state(lake, [{"id": 1, "v": 1, "big": None}], int(end), marked=False)
    window(lake, int(end), [{"_op": "D", "id": 1}])
    merge_history(lake, [NAME])
    assert seen_state_version(delta.open_table(lake.paths.history(T)), lake.paths.history(T)) == 0


def test_a_copy_after_a_commit_that_says_no_state_version_is_still_taken(tmp_path: Path) -> None:
    """A column added to the history (its own commit, with no metadata) does not hide the
    copy made before the next merge."""
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}, {"_op": "I", "id": 2, "v": 2}])
    replace_state(lake, [{"id": 1, "v": 1, "big": None}, {"id": 2, "v": 2, "big": None}],
                  int(end), marked=False)  # fmt: skip
    merge_history(lake, [NAME])
    delta.evolve_schema(lake.paths.history(T), delta.schema_of(
        delta.open_table(lake.paths.history(T))).append(pa.field("x", pa.int64())))  # fmt: skip
    replace_state(lake, [{"id": 1, "v": 1, "big": None}, {"id": 3, "v": 3, "big": None}],
                  int(end), marked=True)  # fmt: skip
    later = window(lake, int(end), [{"_op": "U", "id": 1, "v": 9}])
    merge_history(lake, [NAME])
    assert history_position(lake, NAME) == later
    assert sorted((r[0], r[1]) for r in versions(lake) if r[6]) == [(1, 9), (3, 3)]


def test_a_history_waits_for_a_state_copied_ahead_of_the_lake(tmp_path: Path) -> None:
    """A re-snapshot ahead of the drain: the history begins once the lake gets there, from the
    copy, and never misses its rows."""
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    replace_state(lake, [{"id": 1, "v": 1, "big": None}, {"id": 3, "v": 3, "big": None}],
                  int(end) + 0x100, marked=True)  # fmt: skip
    assert merge_history(lake, [NAME]) == {}
    assert delta.open_table(lake.paths.history(T)) is None
    window(lake, int(end), [{"_op": "U", "id": 1, "v": 2}])  # (below the copy: in it already)
    later = window(lake, int(end) + 0x100, [{"_op": "U", "id": 3, "v": 4}])
    assert merge_history(lake, [NAME]) == {NAME: str(later)}
    assert sorted((r[0], r[1]) for r in versions(lake) if r[6]) == [(1, 1), (3, 4)]


def test_of_copies_at_one_point_the_newest_is_the_table(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])
    for value in (100, 200):  # two copies at the history's own position, none taken between
        keys = (1, value // 100 + 1)  # (1, 2), then (1, 3)
        replace_state(lake, [{"id": k, "v": value, "big": None} for k in keys], int(end),
                      marked=True)  # fmt: skip
    merge_history(lake, [NAME])
    assert sorted((r[0], r[1]) for r in versions(lake) if r[6]) == [(1, 200), (3, 200)]


def test_a_changelog_that_ends_rows_it_never_began_is_no_replay(tmp_path: Path) -> None:
    """A state snapshotted with no mark (whose rows the changelog does not begin): one version
    per state row, no beginning invented for a row the changelog only updated."""
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "U", "id": 1, "v": 10}, {"_op": "D", "id": 2},
                               {"_op": "I", "id": 3, "v": 3}])  # fmt: skip
    replace_state(lake, [{"id": 1, "v": 10, "big": None}, {"id": 3, "v": 3, "big": None}],
                  int(end), marked=False)  # fmt: skip
    merge_history(lake, [NAME])
    assert [(r[0], r[2]) for r in versions(lake)] == [(1, None), (3, None)]


def test_a_changelog_too_big_to_replay_in_memory_begins_from_the_states_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_pglogrepl.merge import history_state

    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    replace_state(lake, [{"id": 1, "v": 1, "big": None}], int(end), marked=False)
    monkeypatch.setattr(history_state, "REPLAY_BYTES", 0)
    merge_history(lake, [NAME])
    assert [(r[0], r[2]) for r in versions(lake)] == [(1, None)]  # no replay: no beginning
