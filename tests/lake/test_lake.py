"""The lake's window API on local disk through delta-rs (no JVM, no server): a window is visible
whole or not at all, a replay after a crash at any step writes nothing twice, and the lake's
position is what the Delta logs say.

Then under concurrency and crashes, against a live cluster and real Spark: readers polling the
tables through ``deltalake`` (no JVM) while drains and merges run only ever see committed
versions; a second writer is refused and loses nothing; a merge killed at any step is finished
by the next run, and the tables end equal to the source.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake.delta import open_table, read_table, txn_version
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import app_id
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.drain import (
    all_changelog_keys,
    drain_app,
    drain_in_process,
    lake_rows,
    source_rows,
    summary,
)
from tests.support.sources import Source

A, B = TableRef("public", "a"), TableRef("public", "b")


def batch(*rows: tuple[int, int, int]) -> pa.Table:
    """Changelog rows ``(id, commit_lsn, seq)`` (a minimal changelog: the lake reads no more)."""
    ids, lsns, seqs = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table({"id": pa.array(ids, pa.int64()), "_op": pa.array(["I"] * len(rows)),
                     "_commit_lsn": pa.array(lsns, pa.int64()),
                     "_seq": pa.array(seqs, pa.int64())})  # fmt: skip


def rows_of(lake: Lake, table: TableRef) -> list[tuple[int, int]]:
    data = read_table(lake.paths.changes(table)).to_pylist()
    return sorted((r["id"], r["_commit_lsn"]) for r in data)


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"), "slot_a")


def test_a_window_is_invisible_until_committed_then_whole(lake: Lake) -> None:
    window = lake.open_window(LSN(0x100))
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
    lake.open_window(LSN(0x100)).commit(LSN(0x300), transactions=0, changes=0)
    assert lake.position() == LSN(0x300) and lake.changes_tables() == []


@pytest.mark.parametrize("tables_committed", [0, 1, 2])
def test_a_crash_inside_the_commit_is_replayed_without_duplicates(
    tmp_path: Path, tables_committed: int
) -> None:
    """The first run dies after committing some tables (not the window row); the re-run drains
    the same changes again (its window may even end elsewhere) and each table keeps one copy."""
    root = str(tmp_path / "lake")
    first = Lake(root, "s")
    window = first.open_window(LSN(0x100))
    window.write(A, batch((1, 0x110, 1), (2, 0x180, 1)))
    window.write(B, batch((7, 0x180, 2)))
    from airflow_pglogrepl.lake import delta

    for name in ["public.a", "public.b"][:tables_committed]:  # what commit() does, cut short
        pending = window._pending[name]
        delta.commit_files(first.paths.changes(name), pending.schema, pending.files,
                           app=first.app, version=0x200, expected=None)  # fmt: skip
    rerun = Lake(root, "s")
    assert rerun.position() is None  # the window row is the commit point: not reached
    again = rerun.open_window(LSN(0x100))  # the slot never moved: same start
    written = again.write(A, batch((1, 0x110, 1), (2, 0x180, 1), (3, 0x220, 1)))
    again.write(B, batch((7, 0x180, 2)))
    again.commit(LSN(0x300), transactions=3, changes=4)
    assert written == (1 if tables_committed >= 1 else 3)
    assert rows_of(rerun, A) == [(1, 0x110), (2, 0x180), (3, 0x220)]
    assert rows_of(rerun, B) == [(7, 0x180)]
    assert rerun.position() == LSN(0x300)


def test_windows_of_another_slot_are_not_this_slots(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    Lake(root, "one").open_window(LSN(0x100)).commit(LSN(0x200), transactions=0, changes=0)
    other = Lake(root, "two")
    assert other.position() is None and other.windows() == []


def test_a_commit_may_not_end_before_it_starts(lake: Lake) -> None:
    with pytest.raises(ValueError, match="before its start"):
        lake.open_window(LSN(0x200)).commit(LSN(0x100), transactions=0, changes=0)


def test_the_windows_table_is_compacted_and_checkpointed(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    import airflow_pglogrepl.lake.lake as lake_module

    monkeypatch.setattr(lake_module, "COMPACT_EVERY", 4)
    for n in range(1, 7):
        lake.open_window(LSN(n * 0x100)).commit(LSN((n + 1) * 0x100), transactions=0, changes=0)
    log = Path(lake.paths.windows(), "_delta_log")
    assert list(log.glob("*.checkpoint.parquet"))
    assert lake.position() == LSN(0x700) and len(lake.windows()) == 6


def _columns(lake: Lake, table: TableRef) -> dict[str, pa.Field]:
    from airflow_pglogrepl.lake.delta import arrow_schema

    schema = arrow_schema(lake.paths.changes(table))
    assert schema is not None
    return {f.name: f for f in schema}


def _num(name: str) -> int:
    """A distinct attribute number for each column name the stub is asked about."""
    return _NUMBERS.setdefault(name, 100 + len(_NUMBERS))


_NUMBERS: dict[str, int] = {}


def _origins(natts: int = 2, attnums: dict[str, int] | None = None, **missing: str | None) -> Any:
    """A catalog stub: ``missing`` values by column (None: a default without one), attnums."""
    from airflow_pglogrepl.models.records import ColumnOrigin, ColumnOrigins

    def origins(table: TableRef, names: Sequence[str]) -> ColumnOrigins:
        columns = {
            n: ColumnOrigin(n, True, missing.get(n), n in missing, (attnums or {}).get(n, _num(n)))
            for n in names
        }
        return ColumnOrigins(natts=natts, columns=columns)

    return origins


def test_an_added_column_is_added_with_what_earlier_rows_hold(tmp_path: Path) -> None:
    from airflow_pglogrepl.lake.evolve import added_at, fill_value

    lake = Lake(str(tmp_path / "lake"), "s", origins=_origins(added="7"))
    first = lake.open_window(LSN(0x100))
    first.write(A, batch((1, 0x110, 1)))
    first.commit(LSN(0x200), transactions=1, changes=1)
    wider = batch((2, 0x210, 3)).append_column(
        pa.field("added", pa.int64(), metadata={"pglogrepl.type": "20:-1"}), pa.array([5])
    )
    window = lake.open_window(LSN(0x200))
    window.write(A, wider)
    window.commit(LSN(0x300), transactions=1, changes=1)
    assert rows_of(lake, A) == [(1, 0x110), (2, 0x210)]
    assert sorted(read_table(lake.paths.changes(A)).column("added").to_pylist(), key=str) == [
        5,
        None,
    ]
    added = _columns(lake, A)["added"]
    assert added_at(added) == (0x210, 3) and fill_value(added) == 7


def test_columns_dropped_and_added_inside_one_window_all_commit(lake: Lake) -> None:
    window = lake.open_window(LSN(0x100))
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

    first = lake.open_window(LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("v", pa.array([1], pa.int64())))
    first.commit(LSN(0x200), transactions=1, changes=1)
    retyped = batch((2, 0x210, 1)).append_column("v", pa.array(["one"]))
    window = lake.open_window(LSN(0x200))
    with pytest.raises(IncompatibleSchemaChangeError, match=r"public\.a: column 'v' changed "
                       r"type from int64 to string.*re-snapshot"):  # fmt: skip
        window.write(A, retyped)
    assert lake.position() == LSN(0x200) and rows_of(lake, A) == [(1, 0x110)]
    assert not [
        p for p in Path(lake.paths.changes(A)).glob("*.parquet") if "0000000000000200" in p.name
    ]


def test_a_volatile_default_stops_the_drain_naming_the_re_snapshot(tmp_path: Path) -> None:
    from airflow_pglogrepl.exceptions import ColumnBackfillError

    lake = Lake(str(tmp_path / "lake"), "s", origins=_origins(stamp=None))
    first = lake.open_window(LSN(0x100))
    first.write(A, batch((1, 0x110, 1)))
    first.commit(LSN(0x200), transactions=1, changes=1)
    stamped = batch((2, 0x210, 1)).append_column("stamp", pa.array(["now"]))
    with pytest.raises(ColumnBackfillError, match=r"'stamp' .*volatile default.*re-snapshot"):
        lake.open_window(LSN(0x200)).write(A, stamped)


def test_a_renamed_column_is_told_from_an_added_one_by_its_attribute_number(
    tmp_path: Path,
) -> None:
    """A new name with a known attribute number is that column renamed: its history reads
    under the new name (metadata only, under column mapping), and its former name stays taken.
    A new name with a new number beside a gone one is a drop and an add: both kept."""
    lake = Lake(str(tmp_path / "lake"), "s", origins=_origins(natts=3, attnums={"b": 3, "c": 3}))
    first = lake.open_window(LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("b", pa.array(["x"])))
    first.commit(LSN(0x200), transactions=1, changes=1)
    renamed = batch((2, 0x210, 1)).append_column("c", pa.array(["y"]))
    window = lake.open_window(LSN(0x200))
    window.write(A, renamed)
    window.commit(LSN(0x300), transactions=1, changes=1)
    columns = _columns(lake, A)
    assert "b" not in columns and columns["c"].metadata[b"pglogrepl.former_names"] == b'["b"]'
    rows = sorted(read_table(lake.paths.changes(A)).to_pylist(), key=lambda r: r["id"])
    assert [r["c"] for r in rows] == ["x", "y"]
    # the same names with "c" added after the table's 3 attributes: a drop and an add
    other = Lake(str(tmp_path / "other"), "s", origins=_origins(natts=3, attnums={"b": 3}))
    first = other.open_window(LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("b", pa.array(["x"])))
    first.commit(LSN(0x200), transactions=1, changes=1)
    other.origins = _origins(natts=4, attnums={"b": 3, "c": 4})
    window = other.open_window(LSN(0x200))
    window.write(A, renamed)
    window.commit(LSN(0x300), transactions=1, changes=1)
    assert {"b", "c"} <= set(_columns(other, A))


def test_a_re_snapshot_restarts_an_incompatible_changelog_and_covers_earlier_rows(
    lake: Lake,
) -> None:
    first = lake.open_window(LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("v", pa.array([1], pa.int64())))
    first.commit(LSN(0x200), transactions=1, changes=1)
    new_schema = batch((9, 0x900, 1)).append_column("v", pa.array(["x"])).schema
    assert lake.restart_changes(A, new_schema, LSN(0x500)) == "restarted"
    assert rows_of(lake, A) == [] and txn_version(lake.paths.changes(A), lake.app) == 0x500
    window = lake.open_window(LSN(0x200))
    covered = batch((2, 0x300, 1), (3, 0x600, 1)).append_column("v", pa.array(["a", "b"]))
    assert window.write(A, covered) == 1  # the row before 0x500 is in the re-snapshot's state
    window.commit(LSN(0x700), transactions=2, changes=2)
    assert rows_of(lake, A) == [(3, 0x600)]
    wider = batch((9, 0x900, 1)).append_column("v", pa.array(["x"]))
    wider = wider.append_column("w", pa.array([1.0]))
    assert lake.restart_changes(A, wider.schema, LSN(0x800)) == "evolved"
    assert "w" in _columns(lake, A) and rows_of(lake, A) == [(3, 0x600)]


def test_a_column_delta_cannot_store_is_named_before_anything_is_written(lake: Lake) -> None:
    from airflow_pglogrepl.exceptions import UnsupportedColumnTypeError

    opening = batch((1, 0x110, 1)).append_column("opens", pa.array([3600_000_000], pa.time64("us")))
    with pytest.raises(UnsupportedColumnTypeError, match=r"public\.a .*opens \(time64\[us\]\)"):
        lake.open_window(LSN(0x100)).write(A, opening)
    assert not Path(lake.paths.changes(A)).exists() and lake.position() is None


SOURCE = {"system_identifier": "7", "timeline": 1, "database": "db", "database_oid": 5}


def test_two_slots_claiming_one_new_lake_at_once_cannot_both_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: the claim's compare-and-set expected a version read after the other
    claim, so both slots claimed the lake (the writer lock is per slot: nothing else orders
    them)."""
    from airflow_pglogrepl.exceptions import LakeCommitConflictError

    root = str(tmp_path / "lake")
    a, b = Lake(root, "a"), Lake(root, "b")
    seen_by_b = b._claims_and_rows()  # b looks first: nobody's lake
    a.claim(SOURCE, publications=["p"], began_with="drain")
    monkeypatch.setattr(b, "_claims_and_rows", lambda: seen_by_b)
    with pytest.raises(LakeCommitConflictError):
        b.claim(SOURCE, publications=["p"], began_with="drain")
    assert Lake(root, "x").identity() == {**(a.identity() or {}), "slot": "a"}


def test_a_lake_holding_nothing_but_claims_belongs_to_nobody_yet(tmp_path: Path) -> None:
    from airflow_pglogrepl.exceptions import LakeOfAnotherSlotError

    root = str(tmp_path / "lake")
    Lake(root, "a").claim(SOURCE, publications=["p"], began_with="snapshot")  # then failed
    claimed = Lake(root, "b").claim(SOURCE, publications=["p"], began_with="snapshot")
    assert claimed["slot"] == "b"
    lake = Lake(root, "b")
    window = lake.open_window(LSN(0x100))
    window.write(A, batch((1, 0x110, 1)))
    window.commit(LSN(0x200), transactions=1, changes=1)
    with pytest.raises(LakeOfAnotherSlotError, match=r"belongs to slot 'b'"):
        Lake(root, "a").claim(SOURCE, publications=["p"], began_with="snapshot")


def test_a_renamed_database_is_the_same_source_and_another_database_is_not(
    tmp_path: Path,
) -> None:
    from airflow_pglogrepl.exceptions import SinkFromAnotherSourceError

    lake = Lake(str(tmp_path / "lake"), "s")
    lake.claim(SOURCE, publications=["p"], began_with="drain")
    renamed = lake.claim({**SOURCE, "database": "db2"}, publications=["p"], began_with="drain")
    assert renamed["database"] == "db2"
    with pytest.raises(SinkFromAnotherSourceError):
        lake.claim({**SOURCE, "database_oid": 6}, publications=["p"], began_with="drain")


def test_a_lake_from_before_claims_that_two_slots_wrote_stays_its_writers(tmp_path: Path) -> None:
    """Review finding: such a lake was refused to every slot, its owner included."""
    from airflow_pglogrepl.exceptions import LakeOfAnotherSlotError

    root = str(tmp_path / "lake")
    for slot, end in (("old", 0x200), ("new", 0x300)):
        writer = Lake(root, slot)
        writer.source = SOURCE
        writer.record(kind="window", start=LSN(end - 0x100), end=LSN(end))
    assert Lake(root, "old").claim(SOURCE, publications=["p"], began_with="drain")["slot"] == "old"
    with pytest.raises(LakeOfAnotherSlotError):  # the first to claim it keeps it
        Lake(root, "new").claim(SOURCE, publications=["p"], began_with="drain")


def test_a_changelog_is_never_emptied_at_or_below_what_it_holds(lake: Lake) -> None:
    """Review finding: a stale re-snapshot's restart of a changelog was a blind overwrite, which
    could forget changes a later run committed past its consistent point."""
    from airflow_pglogrepl.exceptions import LakeCommitConflictError
    from airflow_pglogrepl.lake import delta

    window = lake.open_window(LSN(0x100))
    window.write(A, batch((1, 0x110, 1), (2, 0x280, 1)))
    window.commit(LSN(0x300), transactions=2, changes=2)
    uri = lake.paths.changes(A)
    schema = delta.arrow_schema(uri)
    assert schema is not None
    with pytest.raises(LakeCommitConflictError):
        delta.reset_table(uri, schema, app=lake.app, version=0x200)
    assert txn_version(uri, lake.app) == 0x300 and len(rows_of(lake, A)) == 2


def test_a_re_snapshot_proves_the_lock_before_it_restarts_a_changelog(lake: Lake) -> None:
    """Review finding: re-snapshots of single tables never proved the lock."""
    from airflow_pglogrepl.exceptions import WriterLockLostError

    window = lake.open_window(LSN(0x100))
    window.write(A, batch((1, 0x110, 1)).append_column("v", pa.array([1], pa.int64())))
    window.commit(LSN(0x200), transactions=1, changes=1)

    def lost() -> None:
        raise WriterLockLostError("s", "its session failed")

    lake.writer_check = lost
    new_schema = batch((9, 0x900, 1)).append_column("v", pa.array(["x"])).schema
    with pytest.raises(WriterLockLostError):
        lake.restart_changes(A, new_schema, LSN(0x500))
    assert txn_version(lake.paths.changes(A), lake.app) == 0x200


# Merges and readers run Spark, some as applications of their own (a JVM).

T, U = TableRef("public", "t"), TableRef("public", "u")


def two_tables(src: Source, rows: int = 3000) -> None:
    src.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE u (id int PRIMARY KEY, n int)")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE t, u")
    src.sql("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, %s) g", (rows,))
    src.sql("INSERT INTO u SELECT g, g FROM generate_series(1, %s) g", (rows,))


def churn(src: Source, step: int) -> None:
    src.sql("UPDATE t SET v = %s WHERE id %% 5 = %s", (f"step {step}", step % 5))
    src.sql("DELETE FROM u WHERE id %% 50 = %s", (step % 50,))
    src.sql("INSERT INTO u SELECT g, -g FROM generate_series(%s, %s) g",
            (100_000 + step * 10, 100_000 + step * 10 + 9))  # fmt: skip


def assert_equal_to_source(src: Source, sink: str) -> None:
    for ref in (T, U):
        assert lake_rows(sink, ref) == source_rows(src.cluster, src.db, ref.name), ref
    keys = all_changelog_keys(sink, [T, U])
    assert len(keys) == len(set(keys))


class Reader(threading.Thread):
    """Polls tables through ``deltalake`` as an outside reader would, recording row counts."""

    def __init__(self, uris: list[str]) -> None:
        super().__init__(daemon=True)
        self.uris = uris
        self.seen: dict[str, set[int]] = {uri: set() for uri in uris}
        self.versions: dict[str, set[int]] = {uri: set() for uri in uris}
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for uri in self.uris:
                if open_table(uri) is None:
                    continue
                try:
                    table = open_table(uri)
                    assert table is not None
                    self.versions[uri].add(int(table.version()))
                    self.seen[uri].add(read_table(uri).num_rows)
                except BaseException as exc:  # every failure is a finding
                    self.errors.append(exc)


@pytest.mark.spark
def test_readers_only_ever_see_committed_versions(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    two_tables(source)
    sink = str(tmp_path / "lake")
    lake = Lake(sink, source.slot)
    uris = [lake.paths.state(T), lake.paths.changes(T), lake.paths.state(U)]
    reader = Reader(uris)
    reader.start()
    try:
        drain_in_process(spark, source, sink, window=64 * 1024)
        for step in range(4):
            churn(source, step)
            drain_in_process(spark, source, sink, window=16 * 1024)
    finally:
        reader.stop.set()
        reader.join(timeout=60)
    assert not reader.errors, reader.errors[:3]
    for uri in uris:
        table = open_table(uri)
        assert table is not None
        committed = {read_table(uri, version=v).num_rows for v in range(table.version() + 1)}
        assert reader.seen[uri] <= committed, (uri, reader.seen[uri] - committed)
        assert len(reader.versions[uri]) > 1, f"the reader saw {uri} change only once"
    assert_equal_to_source(source, sink)


@pytest.mark.spark
def test_a_second_writer_is_refused_at_once_and_loses_nothing(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    two_tables(source)
    sink = str(tmp_path / "lake")
    hook = source.hook()
    before = hook.get_slot(source.slot).confirmed_flush_lsn
    # Another run holds the lake (as a drain or snapshot would): refused, naming the holder.
    with hook.writer_lock(source.slot, role="snapshot"):
        refused = drain_app(source, sink)
    assert refused.returncode == 1
    assert "LakeWriterBusyError" in refused.stderr and "backend pid" in refused.stderr
    assert f"pglogrepl snapshot {source.slot}" in refused.stderr
    assert hook.get_slot(source.slot).confirmed_flush_lsn == before
    assert not Path(sink).exists()

    # Two drains started together: the one that comes second is refused while the first runs.
    for step in range(30):
        churn(source, step)
    args = ("--max-window-bytes", "8192")
    first = subprocess.Popen(
        [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", source.slot,
         "--publication", source.publication, "--sink", sink, *args],
        env={**os.environ, "PGLOGREPL_SOURCE_DSN": source.dsn},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        holder = f"pglogrepl drain {source.slot}%"
        wait_until(
            lambda: (
                source.sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                    (holder,),
                )
                == [(1,)]
            ),
            what="the first drain holding the lake",
        )
        second = drain_app(source, sink, *args)
        _, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    if second.returncode == 0:  # the first finished before the second asked: not this test
        pytest.fail("the first drain ended before the second started; the test proves nothing")
    assert "LakeWriterBusyError" in second.stderr and "backend pid" in second.stderr
    done = summary(drain_app(source, sink))
    assert done["changes"] == 0
    assert_equal_to_source(source, sink)


@pytest.mark.spark
@pytest.mark.parametrize("fault", ["merge_created", "merge_committed:1"])
def test_a_merge_killed_at_any_step_is_finished_by_the_next_run(
    spark: Any, source: Source, tmp_path: Path, fault: str
) -> None:
    two_tables(source, rows=500)
    sink = str(tmp_path / "lake")
    summary(drain_app(source, sink))  # both tables merged once
    for step in range(5):
        churn(source, step)
    # One table at a time, so "after the first table's commit" is a state the test can see.
    crashed = drain_app(source, sink, "--merge-parallelism", "1", fault=fault)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    lake = Lake(sink, source.slot)
    position = lake.position()
    behind = [ref for ref in (T, U) if lake.state_version(ref) != position]
    assert behind, "the crash must leave some state behind the lake's position"
    done = summary(drain_app(source, sink))
    assert done["changes"] == 0  # the drain itself had finished: only the merge was left
    position = lake.position()  # (an idle window may have moved it on since)
    assert {LSN(v) for v in done["materialized"].values()} == {position}
    assert set(done["materialized"]) == {str(ref) for ref in behind}
    assert_equal_to_source(source, sink)
    for ref in behind:  # (a state with nothing new keeps its version: merges move it only)
        assert lake.state_version(ref) == position


def test_a_re_snapshot_after_a_key_column_was_renamed_restarts_the_changelog(
    lake: Lake,
) -> None:
    """A key the changelog no longer matches (its column renamed while the table was held, say)
    cannot be evolved into: the re-snapshot restarts the changelog with the new key."""
    from airflow_pglogrepl.changelog.columns import mark_keys

    first = lake.open_window(LSN(0x100))
    keyed = batch((1, 0x110, 1))
    keyed = keyed.cast(pa.schema(mark_keys(keyed.schema, ["id"])))
    first.write(A, keyed)
    first.commit(LSN(0x200), transactions=1, changes=1)
    renamed = batch((9, 0x900, 1)).rename_columns(["ident", "_op", "_commit_lsn", "_seq"])
    renamed = renamed.cast(pa.schema(mark_keys(renamed.schema, ["ident"])))
    assert lake.restart_changes(A, renamed.schema, LSN(0x500)) == "restarted"
    names = _columns(lake, A)
    assert "id" not in names and names["ident"].metadata[b"pglogrepl.key"] == b"0"
