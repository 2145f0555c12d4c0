"""A window of the drain on local disk through delta-rs (no JVM, no server): visible whole or not
at all, a replay after a crash inside its commit writes nothing twice, and the columns a window
writes are checked against what the lake holds (added, dropped, renamed, retyped) before
anything is written."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake.delta import read_table, txn_version
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import app_id
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from tests.support.lake_batches import A, B, batch, columns_of, origins_stub, rows_of


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"), "slot_a")


def test_a_window_is_invisible_until_committed_then_whole(lake: Lake) -> None:
    window = Window(lake, LSN(0x100))
    window.write(A, batch((1, 0x110, 1), (2, 0x110, 2)))
    window.write(A, batch((3, 0x120, 1)))  # a second file of the same table
    window.write(B, batch((9, 0x120, 2)))
    assert lake.position() is None and not Path(lake.paths.changes(A), "_delta_log").exists()
    counts = window.commit(LSN(0x200), transactions=2, changes=4)
    assert counts == {"public.a": 3, "public.b": 1}
    assert rows_of(lake, A) == [(1, 0x110), (2, 0x110), (3, 0x120)]
    assert lake.position() == LSN(0x200)
    for table in (A, B):  # one Delta version per table and window, carrying the app txn
        assert txn_version(lake.paths.changes(table), app_id("slot_a")) == 0x200
        assert lake.changes_version(table) == LSN(0x200)
    (entry,) = lake.windows()
    assert (entry["kind"], entry["start_lsn"], entry["end_lsn"]) == ("window", "0/100", "0/200")


def test_an_empty_window_moves_the_position_only(lake: Lake) -> None:
    Window(lake, LSN(0x100)).commit(LSN(0x300), transactions=0, changes=0)
    assert lake.position() == LSN(0x300) and lake.changes_tables() == []


@pytest.mark.parametrize("tables_committed", [0, 1, 2])
def test_a_crash_inside_the_commit_is_replayed_without_duplicates(
    tmp_path: Path, tables_committed: int
) -> None:
    """The first run dies after committing some tables (not the window row); the re-run drains
    the same changes again (its window may even end elsewhere) and each table keeps one copy."""
    root = str(tmp_path / "lake")
    first = Lake(root, "s")
    window = Window(first, LSN(0x100))
    window.write(A, batch((1, 0x110, 1), (2, 0x180, 1)))
    window.write(B, batch((7, 0x180, 2)))
    from airflow_pglogrepl.lake import delta

    for name in ["public.a", "public.b"][:tables_committed]:  # what commit() does, cut short
        pending = window._pending[name]
        delta.commit_files(first.paths.changes(name), pending.schema, pending.files,
                           app=first.app, version=0x200, expected=None)  # fmt: skip
    rerun = Lake(root, "s")
    assert rerun.position() is None  # the window row is the commit point: not reached
    again = Window(rerun, LSN(0x100))  # the slot never moved: same start
    written = again.write(A, batch((1, 0x110, 1), (2, 0x180, 1), (3, 0x220, 1)))
    again.write(B, batch((7, 0x180, 2)))
    again.commit(LSN(0x300), transactions=3, changes=4)
    assert written == (1 if tables_committed >= 1 else 3)
    assert rows_of(rerun, A) == [(1, 0x110), (2, 0x180), (3, 0x220)]
    assert rows_of(rerun, B) == [(7, 0x180)]
    assert rerun.position() == LSN(0x300)


def test_a_commit_may_not_end_before_it_starts(lake: Lake) -> None:
    with pytest.raises(ValueError, match="before its start"):
        Window(lake, LSN(0x200)).commit(LSN(0x100), transactions=0, changes=0)


def test_an_added_column_is_added_with_what_earlier_rows_hold(tmp_path: Path) -> None:
    from airflow_pglogrepl.lake.evolve import added_at, fill_value

    lake = Lake(str(tmp_path / "lake"), "s", origins=origins_stub(added="7"))
    first = Window(lake, LSN(0x100))
    first.write(A, batch((1, 0x110, 1)))
    first.commit(LSN(0x200), transactions=1, changes=1)
    wider = batch((2, 0x210, 3)).append_column(
        pa.field("added", pa.int64(), metadata={"pglogrepl.type": "20:-1"}), pa.array([5])
    )
    window = Window(lake, LSN(0x200))
    window.write(A, wider)
    window.commit(LSN(0x300), transactions=1, changes=1)
    assert rows_of(lake, A) == [(1, 0x110), (2, 0x210)]
    assert sorted(read_table(lake.paths.changes(A)).column("added").to_pylist(), key=str) == [
        5,
        None,
    ]
    added = columns_of(lake, A)["added"]
    assert added_at(added) == (0x210, 3) and fill_value(added) == 7


def test_columns_dropped_and_added_inside_one_window_all_commit(lake: Lake) -> None:
    window = Window(lake, LSN(0x100))
    old = batch((1, 0x110, 1)).append_column("gone", pa.array(["g"]))
    window.write(A, old)
    window.write(A, batch((2, 0x120, 1)).append_column("new", pa.array([1.5])))
    window.commit(LSN(0x200), transactions=2, changes=2)
    got = read_table(lake.paths.changes(A)).select(["id", "gone", "new"]).to_pylist()
    assert sorted(got, key=lambda r: r["id"]) == [
        {"id": 1, "gone": "g", "new": None},
        {"id": 2, "gone": None, "new": 1.5},
    ]


def test_a_column_changing_its_lake_type_is_refused_and_nothing_is_committed(lake: Lake) -> None:
    from airflow_pglogrepl.exceptions import IncompatibleSchemaChangeError

    first = Window(lake, LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("v", pa.array([1], pa.int64())))
    first.commit(LSN(0x200), transactions=1, changes=1)
    retyped = batch((2, 0x210, 1)).append_column("v", pa.array(["one"]))
    window = Window(lake, LSN(0x200))
    with pytest.raises(IncompatibleSchemaChangeError, match=r"public\.a: column 'v' changed "
                       r"type from int64 to string.*re-snapshot"):  # fmt: skip
        window.write(A, retyped)
    assert lake.position() == LSN(0x200) and rows_of(lake, A) == [(1, 0x110)]
    assert not [
        p for p in Path(lake.paths.changes(A)).glob("*.parquet") if "0000000000000200" in p.name
    ]


def test_a_volatile_default_stops_the_drain_naming_the_re_snapshot(tmp_path: Path) -> None:
    from airflow_pglogrepl.exceptions import ColumnBackfillError

    lake = Lake(str(tmp_path / "lake"), "s", origins=origins_stub(stamp=None))
    first = Window(lake, LSN(0x100))
    first.write(A, batch((1, 0x110, 1)))
    first.commit(LSN(0x200), transactions=1, changes=1)
    stamped = batch((2, 0x210, 1)).append_column("stamp", pa.array(["now"]))
    with pytest.raises(ColumnBackfillError, match=r"'stamp' .*volatile default.*re-snapshot"):
        Window(lake, LSN(0x200)).write(A, stamped)


def test_a_renamed_column_is_told_from_an_added_one_by_its_attribute_number(
    tmp_path: Path,
) -> None:
    """A new name with a known attribute number is that column renamed: its history reads
    under the new name (metadata only, under column mapping), and its former name stays taken.
    A new name with a new number beside a gone one is a drop and an add: both kept."""
    lake = Lake(
        str(tmp_path / "lake"), "s", origins=origins_stub(natts=3, attnums={"b": 3, "c": 3})
    )
    first = Window(lake, LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("b", pa.array(["x"])))
    first.commit(LSN(0x200), transactions=1, changes=1)
    renamed = batch((2, 0x210, 1)).append_column("c", pa.array(["y"]))
    window = Window(lake, LSN(0x200))
    window.write(A, renamed)
    window.commit(LSN(0x300), transactions=1, changes=1)
    columns = columns_of(lake, A)
    assert "b" not in columns and columns["c"].metadata[b"pglogrepl.former_names"] == b'["b"]'
    rows = sorted(read_table(lake.paths.changes(A)).to_pylist(), key=lambda r: r["id"])
    assert [r["c"] for r in rows] == ["x", "y"]
    # the same names with "c" added after the table's 3 attributes: a drop and an add
    other = Lake(str(tmp_path / "other"), "s", origins=origins_stub(natts=3, attnums={"b": 3}))
    first = Window(other, LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("b", pa.array(["x"])))
    first.commit(LSN(0x200), transactions=1, changes=1)
    other.origins = origins_stub(natts=4, attnums={"b": 3, "c": 4})
    window = Window(other, LSN(0x200))
    window.write(A, renamed)
    window.commit(LSN(0x300), transactions=1, changes=1)
    assert {"b", "c"} <= set(columns_of(other, A))


def test_a_column_delta_cannot_store_is_named_before_anything_is_written(lake: Lake) -> None:
    from airflow_pglogrepl.exceptions import UnsupportedColumnTypeError

    opening = batch((1, 0x110, 1)).append_column("opens", pa.array([3600_000_000], pa.time64("us")))
    with pytest.raises(UnsupportedColumnTypeError, match=r"public\.a .*opens \(time64\[us\]\)"):
        Window(lake, LSN(0x100)).write(A, opening)
    assert not Path(lake.paths.changes(A)).exists() and lake.position() is None


def test_rows_at_or_after_the_floor_are_kept_and_only_those() -> None:
    from airflow_pglogrepl.lake.window import at_or_after

    rows = batch((1, 0x100, 1), (2, 0x1FF, 1), (3, 0x200, 1), (4, 0x300, 2))
    assert at_or_after(rows, 0x200).column("id").to_pylist() == [3, 4]
    assert at_or_after(rows, 0).num_rows == 4
