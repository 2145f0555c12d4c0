"""The lake on local disk through delta-rs (no JVM, no server): its position is what the Delta
logs say, the windows table stays compacted, a lake belongs to one slot and source (claims), and
a re-snapshot restarts a changelog it cannot evolve without emptying what it holds. (A window's
own writes and commit: test_window.py.)

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
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake.delta import open_table, read_table, txn_version
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
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
from tests.support.lake_batches import A, B, batch, columns_of, rows_of
from tests.support.sources import Source


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"), "slot_a")


def test_windows_of_another_slot_are_not_this_slots(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    Window(Lake(root, "one"), LSN(0x100)).commit(LSN(0x200), transactions=0, changes=0)
    other = Lake(root, "two")
    assert other.position() is None and other.windows() == []


def test_the_windows_table_is_compacted_and_checkpointed(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    import airflow_pglogrepl.lake.lake as lake_module

    monkeypatch.setattr(lake_module, "COMPACT_EVERY", 4)
    for n in range(1, 7):
        Window(lake, LSN(n * 0x100)).commit(LSN((n + 1) * 0x100), transactions=0, changes=0)
    log = Path(lake.paths.windows(), "_delta_log")
    assert list(log.glob("*.checkpoint.parquet"))
    assert lake.position() == LSN(0x700) and len(lake.windows()) == 6


def test_a_re_snapshot_restarts_an_incompatible_changelog_and_covers_earlier_rows(
    lake: Lake,
) -> None:
    first = Window(lake, LSN(0x100))
    first.write(A, batch((1, 0x110, 1)).append_column("v", pa.array([1], pa.int64())))
    first.commit(LSN(0x200), transactions=1, changes=1)
    new_schema = batch((9, 0x900, 1)).append_column("v", pa.array(["x"])).schema
    assert lake.restart_changes(A, new_schema, LSN(0x500)) == "restarted"
    assert rows_of(lake, A) == [] and txn_version(lake.paths.changes(A), lake.app) == 0x500
    window = Window(lake, LSN(0x200))
    covered = batch((2, 0x300, 1), (3, 0x600, 1)).append_column("v", pa.array(["a", "b"]))
    assert window.write(A, covered) == 1  # the row before 0x500 is in the re-snapshot's state
    window.commit(LSN(0x700), transactions=2, changes=2)
    assert rows_of(lake, A) == [(3, 0x600)]
    wider = batch((9, 0x900, 1)).append_column("v", pa.array(["x"]))
    wider = wider.append_column("w", pa.array([1.0]))
    assert lake.restart_changes(A, wider.schema, LSN(0x800)) == "evolved"
    assert "w" in columns_of(lake, A) and rows_of(lake, A) == [(3, 0x600)]


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
    window = Window(lake, LSN(0x100))
    window.write(A, batch((1, 0x110, 1)))
    window.commit(LSN(0x200), transactions=1, changes=1)
    with pytest.raises(LakeOfAnotherSlotError, match=r"belongs to slot 'b'"):
        Lake(root, "a").claim(SOURCE, publications=["p"], began_with="snapshot")


def test_a_renamed_database_is_the_same_source_and_another_database_is_not(
    tmp_path: Path,
) -> None:
    from airflow_pglogrepl.exceptions import LakeFromAnotherSourceError

    lake = Lake(str(tmp_path / "lake"), "s")
    lake.claim(SOURCE, publications=["p"], began_with="drain")
    renamed = lake.claim({**SOURCE, "database": "db2"}, publications=["p"], began_with="drain")
    assert renamed["database"] == "db2"
    with pytest.raises(LakeFromAnotherSourceError):
        lake.claim({**SOURCE, "database_oid": 6}, publications=["p"], began_with="drain")


def test_a_changelog_is_never_emptied_at_or_below_what_it_holds(lake: Lake) -> None:
    """Review finding: a stale re-snapshot's restart of a changelog was a blind overwrite, which
    could forget changes a later run committed past its consistent point."""
    from airflow_pglogrepl.exceptions import LakeCommitConflictError
    from airflow_pglogrepl.lake import delta, schema_commits

    window = Window(lake, LSN(0x100))
    window.write(A, batch((1, 0x110, 1), (2, 0x280, 1)))
    window.commit(LSN(0x300), transactions=2, changes=2)
    uri = lake.paths.changes(A)
    schema = delta.arrow_schema(uri)
    assert schema is not None
    with pytest.raises(LakeCommitConflictError):
        schema_commits.reset_table(uri, schema, app=lake.app, version=0x200)
    assert txn_version(uri, lake.app) == 0x300 and len(rows_of(lake, A)) == 2


def test_a_re_snapshot_proves_the_lock_before_it_restarts_a_changelog(lake: Lake) -> None:
    """Review finding: re-snapshots of single tables never proved the lock."""
    from airflow_pglogrepl.exceptions import WriterLockLostError

    window = Window(lake, LSN(0x100))
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


def assert_equal_to_source(src: Source, lake_root: str) -> None:
    for ref in (T, U):
        assert lake_rows(lake_root, ref) == source_rows(src.cluster, src.db, ref.name), ref
    keys = all_changelog_keys(lake_root, [T, U])
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
    lake_root = str(tmp_path / "lake")
    lake = Lake(lake_root, source.slot)
    uris = [lake.paths.state(T), lake.paths.changes(T), lake.paths.state(U)]
    reader = Reader(uris)
    reader.start()
    try:
        drain_in_process(spark, source, lake_root, window=64 * 1024)
        for step in range(4):
            churn(source, step)
            drain_in_process(spark, source, lake_root, window=16 * 1024)
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
    assert_equal_to_source(source, lake_root)


@pytest.mark.spark
def test_a_second_writer_is_refused_at_once_and_loses_nothing(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    two_tables(source)
    lake_root = str(tmp_path / "lake")
    hook = source.hook()
    before = hook.get_slot(source.slot).confirmed_flush_lsn
    # Another run holds the lake (as a drain or snapshot would): refused, naming the holder.
    with hook.writer_lock(source.slot, role="snapshot"):
        refused = drain_app(source, lake_root)
    assert refused.returncode == 1
    assert "LakeWriterBusyError" in refused.stderr and "backend pid" in refused.stderr
    assert f"pglogrepl snapshot {source.slot}" in refused.stderr
    assert hook.get_slot(source.slot).confirmed_flush_lsn == before
    assert not Path(lake_root).exists()

    # Two drains started together: the one that comes second is refused while the first runs.
    for step in range(30):
        churn(source, step)
    args = ("--max-window-bytes", "8192")
    first = subprocess.Popen(
        [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", source.slot,
         "--publication", source.publication, "--lake", lake_root, *args],
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
        second = drain_app(source, lake_root, *args)
        _, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    if second.returncode == 0:  # the first finished before the second asked: not this test
        pytest.fail("the first drain ended before the second started; the test proves nothing")
    assert "LakeWriterBusyError" in second.stderr and "backend pid" in second.stderr
    done = summary(drain_app(source, lake_root))
    assert done["changes"] == 0
    assert_equal_to_source(source, lake_root)


@pytest.mark.spark
@pytest.mark.parametrize("fault", ["merge_created", "merge_committed:1"])
def test_a_merge_killed_at_any_step_is_finished_by_the_next_run(
    spark: Any, source: Source, tmp_path: Path, fault: str
) -> None:
    two_tables(source, rows=500)
    lake_root = str(tmp_path / "lake")
    summary(drain_app(source, lake_root))  # both tables merged once
    for step in range(5):
        churn(source, step)
    # One table at a time, so "after the first table's commit" is a state the test can see.
    crashed = drain_app(source, lake_root, "--merge-parallelism", "1", fault=fault)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    lake = Lake(lake_root, source.slot)
    position = lake.position()
    behind = [ref for ref in (T, U) if lake.state_version(ref) != position]
    assert behind, "the crash must leave some state behind the lake's position"
    done = summary(drain_app(source, lake_root))
    assert done["changes"] == 0  # the drain itself had finished: only the merge was left
    position = lake.position()  # (an idle window may have moved it on since)
    assert {LSN(v) for v in done["materialized"].values()} == {position}
    assert set(done["materialized"]) == {str(ref) for ref in behind}
    assert_equal_to_source(source, lake_root)
    for ref in behind:  # (a state with nothing new keeps its version: merges move it only)
        assert lake.state_version(ref) == position


def test_a_re_snapshot_after_a_key_column_was_renamed_restarts_the_changelog(
    lake: Lake,
) -> None:
    """A key the changelog no longer matches (its column renamed while the table was held, say)
    cannot be evolved into: the re-snapshot restarts the changelog with the new key."""
    from airflow_pglogrepl.changelog.columns import mark_keys

    first = Window(lake, LSN(0x100))
    keyed = batch((1, 0x110, 1))
    keyed = keyed.cast(pa.schema(mark_keys(keyed.schema, ["id"])))
    first.write(A, keyed)
    first.commit(LSN(0x200), transactions=1, changes=1)
    renamed = batch((9, 0x900, 1)).rename_columns(["ident", "_op", "_commit_lsn", "_seq"])
    renamed = renamed.cast(pa.schema(mark_keys(renamed.schema, ["ident"])))
    assert lake.restart_changes(A, renamed.schema, LSN(0x500)) == "restarted"
    names = columns_of(lake, A)
    assert "id" not in names and names["ident"].metadata[b"pglogrepl.key"] == b"0"


def test_the_floor_is_what_a_table_holds_past_the_start_and_nothing_else(lake: Lake) -> None:
    """``Lake.floor``: rows of a window from ``start`` below it are in the lake already."""
    assert lake.floor(A, LSN(0x100)) == 0  # nothing yet
    window = Window(lake, LSN(0x100))
    window.write(A, batch((1, 0x110, 1)))
    window.commit(LSN(0x200), transactions=1, changes=1)
    assert lake.floor(A, LSN(0x100)) == 0x200  # a window from 0x100 again: a replay
    assert lake.floor(A, LSN(0x200)) == 0  # the next window: all of it is new
    assert lake.floor(B, LSN(0x100)) == 0  # a table the lake never held
