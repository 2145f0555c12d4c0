"""history/<table> kept from the changelog without a JVM: begun, merged, exactly once."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.columns import IDENTITY_META, KEY_META
from airflow_pglogrepl.changelog.history_columns import (
    ENDED_BY,
    IS_CURRENT,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO_LSN,
)
from airflow_pglogrepl.exceptions import LakeError, WriterLockLostError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.history import (
    history_position,
    history_tables,
    merge_history,
)
from airflow_pglogrepl.tables import TableRef

T = TableRef("public", "t")
NAME = "public.t"
TABLE = [pa.field("id", pa.int64(), metadata={KEY_META: "0"}), pa.field("v", pa.int64()),
         pa.field("big", pa.string())]  # fmt: skip


def schema(identity: str = "d", extra: list[pa.Field] | None = None) -> pa.Schema:
    table = [*TABLE, *(extra or [])]
    return pa.schema([
        *table,
        pa.field("_op", pa.string(), metadata={IDENTITY_META: identity}),
        pa.field("_commit_lsn", pa.int64()),
        pa.field("_seq", pa.int64()),
        pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
        pa.field("_unchanged", pa.list_(pa.string())),
        pa.field("_old", pa.struct([pa.field(f.name, f.type) for f in table])),
    ])  # fmt: skip


def window(lake: Lake, start: int, rows: list[dict[str, Any]], *,
           extra: list[pa.Field] | None = None) -> LSN:  # fmt: skip
    """One committed window of ``rows`` (op, id, v[, big, unchanged, old]) from ``start``, one
    transaction per row."""
    full = []
    for index, row in enumerate(rows):
        lsn = start + 0x10 * (index + 1)
        full.append(
            {
                "big": None,
                "_unchanged": [],
                "_old": None,
                **row,
                "_commit_lsn": lsn,
                "_seq": 0,
                "_commit_ts": datetime.datetime.fromtimestamp(lsn, datetime.UTC),
            }
        )
    end = LSN(start + 0x10 * (len(rows) + 1))
    batch = Window(lake, LSN(start))
    batch.write(T, pa.Table.from_pylist(full, schema=schema(extra=extra)))
    batch.commit(end, transactions=len(rows), changes=len(rows))
    return end


def history(lake: Lake) -> list[tuple[Any, ...]]:
    rows = delta.scan(lake.paths.history(T)).to_pylist()
    return sorted((r["id"], r["v"], r["big"], r[VALID_FROM_LSN], r[VALID_TO_LSN], r[ENDED_BY],
                   r[IS_CURRENT]) for r in rows)  # fmt: skip


def test_a_history_begun_with_the_changelog_holds_every_version(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1, "big": "toast"},
                               {"_op": "I", "id": 2, "v": 2}])  # fmt: skip
    assert history_tables(lake, True) == [NAME] == history_tables(lake, ["public.t"])
    assert history_tables(lake, False) == [] == history_tables(lake, ["public.other"])
    assert merge_history(lake, [NAME]) == {NAME: str(end)}
    later = window(lake, int(end), [
        {"_op": "U", "id": 1, "v": 10, "_unchanged": ["big"]},
        {"_op": "U", "id": 3, "v": 2, "_old": {"id": 2, "v": None, "big": None}},
        {"_op": "D", "id": 1},
    ])  # fmt: skip
    assert merge_history(lake, [NAME]) == {NAME: str(later)}
    a, b = int(end), int(later)
    assert history(lake) == [
        (1, 1, "toast", 0x110, a + 0x10, "update", False),
        (1, 10, "toast", a + 0x10, a + 0x30, "delete", False),
        (2, 2, None, 0x120, a + 0x20, "key_change", False),
        (3, 2, None, a + 0x20, None, None, True),
    ]
    assert history_position(lake, NAME) == later < LSN(b + 1)
    assert merge_history(lake, [NAME]) == {NAME: str(later)}  # a replay: nothing new
    assert delta.open_table(lake.paths.history(T)).version() == 1


def test_a_history_begins_from_the_state_it_finds(tmp_path: Path) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "U", "id": 1, "v": 5, "_unchanged": ["big"]}])
    state = pa.table({"id": [1, 2], "v": [1, 2], "big": ["kept", None]})
    write_deltalake(lake.paths.state(T), state, commit_properties=CommitProperties(
        app_transactions=[Transaction(lake.app, 0x100)]))  # fmt: skip
    merge_history(lake, [NAME])
    assert history(lake) == [
        (1, 1, "kept", None, 0x110, "update", False),
        (1, 5, "kept", 0x110, None, None, True),
        (2, 2, None, None, None, None, True),
    ]
    begun = delta.scan(lake.paths.history(T)).to_pylist()
    assert sorted(r[VALID_FROM_SEQ] for r in begun if r[VALID_FROM_LSN] is None) == [0, 1]
    assert history_position(lake, NAME) == end


@pytest.mark.parametrize("change", [{"_op": "U", "id": 1, "v": 2}, {"_op": "I", "id": 2, "v": 2}])
def test_a_writer_that_lost_its_lock_commits_nothing_and_the_next_run_does_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any]
) -> None:
    """Proven right before the commit, the MERGE's (an update ends a version) or the append's
    (an insert ends none)."""
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])
    later = window(lake, int(end), [change])
    before, version = history(lake), delta.open_table(lake.paths.history(T)).version()

    def lost() -> None:
        raise WriterLockLostError("s", "the lock is gone")

    monkeypatch.setattr(lake, "check_writer", lost)
    with pytest.raises(WriterLockLostError, match="lock is gone"):
        merge_history(lake, [NAME])
    assert history(lake) == before and history_position(lake, NAME) == end
    assert delta.open_table(lake.paths.history(T)).version() == version
    monkeypatch.undo()
    assert merge_history(lake, [NAME]) == {NAME: str(later)}
    assert len(history(lake)) == 2


def test_a_window_without_changes_of_the_table_moves_its_position(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])
    empty = Window(lake, end)
    empty.commit(LSN(int(end) + 0x100), transactions=0, changes=0)
    assert merge_history(lake, [NAME]) == {NAME: str(LSN(int(end) + 0x100))}
    assert history_position(lake, NAME) == LSN(int(end) + 0x100)


def test_a_column_added_at_the_source_is_added_to_the_history(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    merge_history(lake, [NAME])
    extra = [pa.field("note", pa.string())]
    window(lake, int(end), [{"_op": "U", "id": 1, "v": 2, "note": "n"}], extra=extra)
    merge_history(lake, [NAME])
    rows = sorted(delta.scan(lake.paths.history(T)).to_pylist(), key=lambda r: r["v"])
    assert [(r["v"], r["note"], r[IS_CURRENT]) for r in rows] == [(1, None, False),
                                                                 (2, "n", True)]  # fmt: skip


def test_an_unchanged_toast_value_of_a_row_the_history_lacks_fails_naming_the_fix(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    window(lake, 0x100, [{"_op": "U", "id": 7, "v": 1, "_unchanged": ["big"]}])
    with pytest.raises(LakeError, match=r"row \{'id': 7\}.*delete the directory history/public.t"):
        merge_history(lake, [NAME])
    assert delta.open_table(lake.paths.history(T)) is None


def test_a_history_turned_on_later_replays_the_changelog_that_made_the_state(
    tmp_path: Path,
) -> None:
    """The state was merged from the changelog alone (no snapshot): the history gets every
    version with its exact beginning, not one version per row from the state."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}, {"_op": "U", "id": 1, "v": 2}])
    state = pa.table({"id": [1], "v": [2], "big": pa.array([None], pa.string())})
    write_deltalake(lake.paths.state(T), state, commit_properties=CommitProperties(
        app_transactions=[Transaction(lake.app, int(end))]))  # fmt: skip
    merge_history(lake, [NAME])
    assert history(lake) == [(1, 1, None, 0x110, 0x120, "update", False),
                             (1, 2, None, 0x120, None, None, True)]  # fmt: skip


def test_a_table_whose_history_fails_stops_no_other_and_is_named(tmp_path: Path) -> None:
    """A column named like the history's own is refused cleanly; the other tables' histories
    are merged all the same, and one error names the table, the column and the fix."""
    lake = Lake(str(tmp_path / "lake"), "s")
    other = TableRef("public", "other")
    own = [
        pa.field("id", pa.int64(), metadata={KEY_META: "0"}),
        pa.field("_is_current", pa.string()),
    ]
    meta = [f for f in schema() if f.name in ("_op", "_commit_lsn", "_seq", "_commit_ts",
                                              "_unchanged")]  # fmt: skip
    clash = pa.schema([*own, *meta, pa.field("_old", pa.struct(own))])
    batch = Window(lake, LSN(0x100))
    batch.write(
        other,
        pa.Table.from_pylist(
            [{"id": 1, "_is_current": "x", "_op": "I", "_commit_lsn": 0x110, "_seq": 0}],
            schema=clash,
        ),
    )
    batch.write(T, pa.Table.from_pylist([{"id": 1, "v": 1, "_op": "I", "_commit_lsn": 0x120,
                                          "_seq": 1}], schema=schema()))  # fmt: skip
    batch.commit(LSN(0x200), transactions=2, changes=2)
    with pytest.raises(LakeError, match=r"public.other: .*\['_is_current'\].*history=\[\.\.\.\]"):
        merge_history(lake, history_tables(lake, True))
    assert history(lake) == [(1, 1, None, 0x120, None, None, True)]
    assert delta.open_table(lake.paths.history(other)) is None


def test_a_history_asked_for_a_table_the_lake_lacks_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}])
    with caplog.at_level("WARNING", logger="airflow_pglogrepl.lake"):
        assert history_tables(lake, ["public.t", "public.typo"]) == [NAME]
    assert "public.typo, which the lake holds no changelog of" in caplog.text


@pytest.mark.parametrize("merges", ["after_each_window", "once_after_both"])
def test_a_column_added_with_a_default_holds_it_in_the_versions_from_before(
    tmp_path: Path, merges: str
) -> None:
    """``ADD COLUMN extra int DEFAULT 7``: the rows from before hold 7 at the source and in the
    state, and so in their versions: those in the history already, and those a batch opens
    from changes made before the column was there."""
    from tests.support.lake_batches import origins_stub

    extra = pa.field("extra", pa.int64(), metadata={"pglogrepl.type": "20:-1"})
    lake = Lake(str(tmp_path / "lake"), "s", origins=origins_stub(natts=4, extra="7"))
    end = window(lake, 0x100, [{"_op": "I", "id": 1, "v": 1}, {"_op": "I", "id": 2, "v": 2}])
    if merges == "after_each_window":
        merge_history(lake, [NAME])
    window(lake, int(end), [{"_op": "U", "id": 1, "v": 10, "extra": 5}], extra=[extra])
    merge_history(lake, [NAME])
    rows = delta.scan(lake.paths.history(T)).to_pylist()
    got = sorted((r["id"], r["v"], r["extra"], r[IS_CURRENT]) for r in rows)
    assert got == [(1, 1, 7, False), (1, 10, 5, True), (2, 2, 7, True)]


def test_current_versions_are_joined_with_the_keys_a_chunk_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each join builds its table of the keys again: one per scanned batch of 8,192 rows made
    a million keys against two million versions take 27 s instead of 0.7."""
    from airflow_pglogrepl.merge import history

    parts = [pa.table({"id": pa.array(range(i * 100, (i + 1) * 100), pa.int64())})
             for i in range(10)]  # fmt: skip
    monkeypatch.setattr(history, "PRIOR_CHUNK_BYTES", 4000)  # five of these parts
    chunks = list(history._chunks(iter(parts)))
    assert [c.num_rows for c in chunks] == [500, 500]
    assert pa.concat_tables(chunks).equals(pa.concat_tables(parts))
