"""The consistent cut on small Delta tables built by hand with delta-rs (no JVM, no server): the
versions it picks for lagging states, changes committed above the lake's position, tables that
do not exist yet, re-snapshotted tables and logs that cleanup shortened.

Then live: drains and merges on Spark in the background while a reader reads two tables through
the cut, where every source transaction wrote the same id to both: the reader must never see one
table with a transaction the other lacks.

Positions are small integers here: window ends, as the drain's app transactions carry them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake import delta, schema_commits
from airflow_pglogrepl.lake.cut import Kind, consistent_cut, read_cut, read_cut_spark
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import LakePaths, app_id, table_dir
from airflow_pglogrepl.lake.txnlog import HistoryExpiredError, TxnLog, TxnVersion
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.tables import TableRef
from tests.support.sources import Source

SLOT = "slot_a"
APP = app_id(SLOT)
A, B, C = "public.a", "public.b", "public.c"


class Built:
    """A lake written the way the drain writes it, table by table and window by window."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.paths = LakePaths(self.root)
        self.lake = Lake(self.root, SLOT)
        self.start = 0

    def window(self, end: int) -> None:
        """The windows row that makes ``[start, end)`` part of the lake."""
        self.lake.record(kind="window", start=LSN(self.start), end=LSN(end))
        self.start = end

    def changes(self, table: str, end: int, *ids: int) -> None:
        """``table``'s rows of the window ending at ``end`` (their commit LSN just below it)."""
        rows = pa.table({"id": pa.array(ids, pa.int64()),
                         "_commit_lsn": pa.array([end - 1] * len(ids), pa.int64())})  # fmt: skip
        uri = self.paths.changes(table)
        written = delta.write_file(uri, rows, prefix=f"{end:016X}")
        delta.commit_files(uri, rows.schema, [written], app=APP, version=end,
                           expected=delta.txn_version(uri, APP))  # fmt: skip

    def state(self, table: str, at: int, ids: Iterable[int]) -> None:
        """``table``'s whole state at ``at``, as one version (a merge or a snapshot)."""
        rows = pa.table({"id": pa.array(sorted(ids), pa.int64())})
        write_deltalake(self.paths.state(table), rows, mode="overwrite",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(APP, at)]))  # fmt: skip

    def version(self, kind: str, table: str) -> int:
        """The newest version of a table (what a step just committed)."""
        uri = self.paths.state(table) if kind == "state" else self.paths.changes(table)
        found = delta.open_table(uri)
        assert found is not None
        return int(found.version())


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


@pytest.fixture
def built(tmp_path: Path) -> Built:
    return Built(tmp_path / "lake")


def test_tables_in_step_are_read_at_the_lakes_position(built: Built) -> None:
    for end, row in ((10, 1), (20, 2)):
        built.changes(A, end, row)
        built.changes(B, end, row)
        built.window(end)
        built.state(A, end, range(1, row + 1))
        built.state(B, end, range(1, row + 1))
    cut = consistent_cut(built.root)
    assert cut.position == LSN(20)
    assert cut.versions == {A: built.version("state", A), B: built.version("state", B)}
    assert {name: ids(t) for name, t in read_cut(cut).items()} == {A: [1, 2], B: [1, 2]}


def test_a_lagging_state_moves_the_cut_back_to_where_every_table_is_merged(built: Built) -> None:
    built.changes(A, 10, 1)
    built.changes(B, 10, 1)
    built.window(10)
    built.state(A, 10, [1])
    built.state(B, 10, [1])
    built.changes(A, 20, 2)
    built.window(20)  # b had nothing in [10, 20): its state of 10 is b at 20
    built.state(A, 20, [1, 2])
    a_at_20 = built.version("state", A)
    built.changes(A, 30, 3)
    built.changes(B, 30, 3)
    built.window(30)
    built.state(A, 30, [1, 2, 3])  # merged; b's merge of 30 has not run yet
    cut = consistent_cut(built.root, [A, B])
    assert cut.position == LSN(20)
    assert cut.versions == {A: a_at_20, B: 0}
    assert {name: ids(t) for name, t in read_cut(cut).items()} == {A: [1, 2], B: [1]}
    # each table alone is readable at the lake's position or at the greatest one before
    assert consistent_cut(built.root, [A]).position == LSN(30)
    assert consistent_cut(built.root, [B]).position == LSN(20)
    built.state(B, 30, [1, 3])
    assert consistent_cut(built.root, [A, B]).position == LSN(30)


def test_a_state_merged_past_an_unmerged_window_is_not_read_there(built: Built) -> None:
    built.changes(A, 10, 1)
    built.window(10)
    built.state(A, 10, [1])
    built.changes(A, 20, 2)
    built.window(20)
    built.changes(A, 30, 3)
    built.window(30)
    built.changes(B, 40, 4)
    built.window(40)
    built.state(A, 40, [1, 2, 3])
    # b not merged at 40; a's state at 20 or 30 would be its state of 10: only 10 is a's and b's
    cut = consistent_cut(built.root, [A, B])
    assert cut.position == LSN(10)
    assert cut.versions == {A: 0, B: None}


def test_changes_committed_above_the_lakes_position_are_not_read_yet(built: Built) -> None:
    for end in (10, 20):
        built.changes(A, end, end)
        built.changes(B, end, end)
        built.window(end)
        built.state(A, end, range(10, end + 1, 10))
        built.state(B, end, range(10, end + 1, 10))
    built.changes(A, 30, 30)  # window 30: a committed, b and the windows row not yet
    changes = consistent_cut(built.root, kind="changes")
    assert changes.position == LSN(20)
    assert changes.versions == {A: built.version("changes", A) - 1, B: built.version("changes", B)}
    read = read_cut(changes)
    assert sorted(read[A].column("_commit_lsn").to_pylist()) == [9, 19]
    assert sorted(read[B].column("_commit_lsn").to_pylist()) == [9, 19]
    state = consistent_cut(built.root, [A, B])
    assert state.position == LSN(20)
    assert {name: ids(t) for name, t in read_cut(state).items()} == {A: [10, 20], B: [10, 20]}


def test_tables_that_do_not_exist_at_the_position_are_none(built: Built) -> None:
    built.changes(A, 10, 1)
    built.window(10)
    built.state(A, 10, [1])
    built.changes(A, 20, 2)
    built.changes(C, 20, 7)  # c's first change
    built.window(20)
    built.state(C, 20, [7])  # a's merge of 20 has not run: the cut is at 10, before c
    cut = consistent_cut(built.root)
    assert cut.position == LSN(10)
    assert cut.versions == {A: 0, C: None}
    assert set(read_cut(cut)) == {A}
    missing = consistent_cut(built.root, [A, TableRef("public", "nope")])
    assert missing.versions == {A: 0, "public.nope": None}
    assert consistent_cut(built.root, kind="changes").versions == {A: 1, C: 0}


def test_a_cut_at_an_lsn_is_the_cut_of_the_newest_position_at_or_below_it(built: Built) -> None:
    built.changes(A, 10, 1)
    built.changes(B, 10, 1)
    built.window(10)
    built.state(A, 10, [1])
    built.state(B, 10, [1])
    a_at_10, b_at_10 = built.version("state", A), built.version("state", B)
    built.changes(A, 20, 2)
    built.window(20)
    built.changes(A, 30, 3)
    built.changes(B, 30, 3)
    built.window(30)
    built.state(A, 30, [1, 2, 3])
    built.state(B, 30, [1, 3])
    now = consistent_cut(built.root, [A, B])
    assert consistent_cut(built.root, [A, B], at=LSN(30)) == now
    assert consistent_cut(built.root, [A, B], at="0/FFFFFFFF") == now
    back = consistent_cut(built.root, [A, B], at="0/1D")  # 29: the position of 20
    # a's changes of 20 were never merged at 20: back again, to 10, where both were
    assert (back.position, back.versions) == (LSN(10), {A: a_at_10, B: b_at_10})
    assert {name: ids(t) for name, t in read_cut(back).items()} == {A: [1], B: [1]}
    changes = consistent_cut(built.root, [A, B], kind="changes", at=25)
    assert (changes.position, changes.versions) == (LSN(20), {A: 1, B: 0})
    assert sorted(read_cut(changes)[A].column("_commit_lsn").to_pylist()) == [9, 19]
    before = consistent_cut(built.root, [A, B], at=9)
    assert (before.position, before.versions) == (None, {A: None, B: None})


def test_a_cut_at_an_lsn_older_than_a_log_keeps_has_expired(built: Built) -> None:
    for end in (10, 20, 30):
        built.changes(A, end, end)
        built.window(end)
        built.state(A, end, range(10, end + 1, 10))
    state = delta.open_table(built.paths.state(A))
    assert state is not None
    type(state)(built.paths.state(A), version=1).create_checkpoint()
    for version in (0, 1):
        os.remove(Path(built.paths.state(A), "_delta_log", f"{version:020d}.json"))
    assert ids(read_cut(consistent_cut(built.root, [A], at=25))[A]) == [10, 20]
    with pytest.raises(HistoryExpiredError, match="version 1"):
        consistent_cut(built.root, [A], at=15)


def test_a_lake_without_a_window_has_no_position(built: Built) -> None:
    cut = consistent_cut(built.root, [A], slot=SLOT)
    assert (cut.position, cut.versions) == (None, {A: None})
    with pytest.raises(LakeError, match="no committed window"):
        consistent_cut(built.root)


def test_the_slot_must_be_named_when_the_lake_holds_several(built: Built) -> None:
    built.window(10)
    Lake(built.root, "slot_b").record(kind="window", start=LSN(0), end=LSN(5))
    with pytest.raises(LakeError, match=r"slot_a.*slot_b"):
        consistent_cut(built.root)
    assert consistent_cut(built.root, slot="slot_b").position == LSN(5)
    assert consistent_cut(built.root, slot=SLOT).position == LSN(10)


def test_a_re_snapshotted_state_is_read_from_its_consistent_point_on(built: Built) -> None:
    built.changes(A, 10, 1)
    built.changes(B, 10, 1)
    built.window(10)
    built.state(A, 10, [1])
    built.state(B, 10, [1])
    built.changes(A, 20, 2)
    built.window(20)
    built.state(A, 20, [1, 2])
    # a re-snapshot of b at 25 (a temporary slot's point, no window end) saw b's rows 5 and 6,
    # committed in the source in [10, 25); the changelog restarts at 25, and the window that
    # follows drops b's changes below 25 (the state holds them): it brings none of b's
    built.state(B, 25, [1, 5, 6])
    snapshot = built.version("state", B)
    schema_commits.reset_table(built.paths.changes(B), pa.schema([("id", pa.int64()),
                      ("_commit_lsn", pa.int64())]), app=APP, version=25)  # fmt: skip
    # before the window past 25 commits, b's state of 10 is b at 20
    cut = consistent_cut(built.root, [A, B])
    assert cut.position == LSN(20)
    assert {name: ids(t) for name, t in read_cut(cut).items()} == {A: [1, 2], B: [1]}
    built.changes(A, 30, 3)
    built.window(30)
    built.state(A, 30, [1, 2, 3])
    cut = consistent_cut(built.root, [A, B])
    assert cut.position == LSN(30)
    assert cut.versions[B] == snapshot, "b's newest state at or below 30 is the re-snapshot"
    assert ids(read_cut(cut)[B]) == [1, 5, 6]
    built.changes(B, 40, 8)
    built.window(40)
    built.state(A, 40, [1, 2, 3])
    # b's changelog moved past its snapshot, its merge has not run: back to 30
    assert consistent_cut(built.root, [A, B]).position == LSN(30)
    assert consistent_cut(built.root, [B], kind="changes").versions == {B: 2}


def test_a_re_snapshot_that_kept_the_changelog_is_not_mistaken_for_an_older_state(
    built: Built,
) -> None:
    built.changes(B, 10, 1)
    built.window(10)
    built.state(B, 10, [1])
    built.state(B, 15, [1, 2])  # re-snapshot at 15; b changed at 12, its changelog never will
    built.window(20)
    cut = consistent_cut(built.root, [B])
    assert cut.position == LSN(20)
    assert cut.versions == {B: built.version("state", B)}
    assert ids(read_cut(cut)[B]) == [1, 2]


def test_the_log_is_read_from_the_newest_commit_down(built: Built) -> None:
    for end in (10, 20, 30):
        built.changes(A, end, end)
    delta.evolve_schema(built.paths.changes(A), pa.schema([("id", pa.int64()),
                        ("_commit_lsn", pa.int64()), ("x", pa.int64())]))  # fmt: skip
    log = TxnLog(built.paths.changes(A), APP)
    # the schema change (version 3) carries no transaction: it holds the rows of 30
    assert log.at_or_below(35) == TxnVersion(3, 30)
    assert log.at_or_below(29) == TxnVersion(1, 20)
    assert log.at_or_below(9) is None
    assert TxnLog(built.paths.changes(B), APP).at_or_below(100) is None
    assert not TxnLog(built.paths.changes(B), APP).exists


def test_a_log_shortened_by_cleanup_is_read_from_its_checkpoint(built: Built) -> None:
    for end in (10, 20, 30, 40):
        built.changes(A, end, end)
    table = delta.open_table(built.paths.changes(A))
    assert table is not None
    table = type(table)(built.paths.changes(A), version=1)
    table.create_checkpoint()  # at version 1, then cleanup took versions 0 and 1's commits
    log_dir = Path(built.paths.changes(A)) / "_delta_log"
    for version in (0, 1):
        os.remove(log_dir / f"{version:020d}.json")
    log = TxnLog(built.paths.changes(A), APP)
    assert log.at_or_below(45) == TxnVersion(3, 40)
    assert log.at_or_below(25) == TxnVersion(1, 20)  # from the checkpoint
    with pytest.raises(HistoryExpiredError, match="version 1"):
        log.at_or_below(15)


def test_window_ends_past_the_windows_log_come_from_its_rows(built: Built) -> None:
    for end in (10, 20, 30, 40):
        built.changes(A, end, end)
        built.window(end)
        if end <= 20:
            built.state(A, end, range(10, end + 1, 10))
    windows = delta.open_table(built.paths.windows())
    assert windows is not None
    windows.create_checkpoint()
    log_dir = Path(built.paths.windows()) / "_delta_log"
    for version in range(3):
        os.remove(log_dir / f"{version:020d}.json")  # the windows of 10, 20 and 30
    cut = consistent_cut(built.root, [A])
    assert cut.position == LSN(20)
    assert ids(read_cut(cut)[A]) == [10, 20]


# -- live: drains and merges on Spark while a reader reads through the cut ---------------------

PAIR = (TableRef("public", "a"), TableRef("public", "b"))


def pair_of_tables(src: Source) -> None:
    src.sql("CREATE TABLE a (id int PRIMARY KEY, v int)")
    src.sql("CREATE TABLE b (id int PRIMARY KEY, v int)")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE a, b")


def transactions(src: Source, first: int, count: int) -> None:
    """``count`` transactions, each inserting one id into both tables; some also update an
    earlier id in both, or delete one from both (one DO block, a COMMIT per iteration)."""
    src.sql(f"""
        DO $$ BEGIN
          FOR i IN {first}..{first + count - 1} LOOP
            INSERT INTO a VALUES (i, i);
            INSERT INTO b VALUES (i, -i);
            IF i % 3 = 0 THEN
              UPDATE a SET v = v + 1 WHERE id = i - 1;
              UPDATE b SET v = v - 1 WHERE id = i - 1;
            END IF;
            IF i % 5 = 0 THEN
              DELETE FROM a WHERE id = i - 2;
              DELETE FROM b WHERE id = i - 2;
            END IF;
            COMMIT;
          END LOOP;
        END $$""")


class Drains(threading.Thread):
    """Rounds of source transactions, each drained in small windows and merged on Spark, one
    table after the other: ``state/a`` is then ahead of ``state/b`` for a whole merge, as
    ``changes/a`` is ahead of ``changes/b`` between their commits of each window."""

    def __init__(self, spark: Any, src: Source, lake_root: str, rounds: int) -> None:
        super().__init__(daemon=True)
        self.spark, self.src, self.lake_root, self.rounds = spark, src, lake_root, rounds
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for step in range(self.rounds):
                transactions(self.src, 1 + step * 100, 100)
                hook = self.src.hook()
                lake = Lake(self.lake_root, self.src.slot, origins=hook.column_origins)
                with hook.writer_lock(self.src.slot):
                    Drain(source=hook, lake=lake, slot=self.src.slot,
                          publications=[self.src.publication],
                          max_window_bytes=8 * 1024).run(time.monotonic())  # fmt: skip
                    materialize(self.spark, lake, parallelism=1)
        except BaseException as exc:  # reported by the test, after the reader stops
            self.error = exc


def read_pair(lake_root: str, slot: str, kind: Kind) -> tuple[LSN | None, dict[str, pa.Table]]:
    """Both tables as a reader sees them: through a consistent cut."""
    cut = consistent_cut(lake_root, PAIR, kind=kind, slot=slot)
    return cut.position, read_cut(cut)


def column_set(tables: dict[str, pa.Table], name: str, column: str) -> set[int]:
    table = tables.get(name)
    return set() if table is None else set(table.column(column).to_pylist())


def test_a_reader_of_a_cut_never_sees_a_transaction_half_applied(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    pair_of_tables(source)
    lake_root = str(tmp_path / "lake")
    drains = Drains(spark, source, lake_root, rounds=3)
    positions: dict[str, set[LSN]] = {"state": set(), "changes": set()}
    drains.start()
    kinds: tuple[tuple[Kind, str], ...] = (("state", "id"), ("changes", "_commit_lsn"))
    while drains.is_alive():  # the reader: as often as it can while drains and merges run
        for kind, column in kinds:
            position, tables = read_pair(lake_root, source.slot, kind)
            a, b = (column_set(tables, table_dir(t), column) for t in PAIR)
            assert a == b, f"{kind} at {position}: only in a {a - b}, only in b {b - a}"
            if position is not None and a:
                positions[kind].add(position)
    drains.join()
    assert drains.error is None, drains.error
    assert len(positions["state"]) > 1, f"the reader saw the state at {positions['state']} only"
    assert len(positions["changes"]) > 1, positions["changes"]
    built = Built(Path(lake_root))
    final = consistent_cut(lake_root, PAIR, slot=source.slot)
    assert final.position == Lake(lake_root, source.slot).position()
    assert final.versions == {table_dir(t): built.version("state", table_dir(t)) for t in PAIR}
    source_ids = {r[0] for r in source.sql("SELECT id FROM a")}
    assert column_set(read_cut(final), "public.a", "id") == source_ids
    # and through Spark, at the same versions
    frames = read_cut_spark(spark, final)
    assert {n: {r.id for r in f.select("id").collect()} for n, f in frames.items()} == {
        table_dir(t): source_ids for t in PAIR
    }
