"""The JVM-free merge of small keyed batches: random changelogs against a sequential model, on a
real Delta lake (delta-rs), and what it declines to Spark."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.columns import IDENTITY_META, KEY_META
from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake.delta import read_table, txn_version
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.merge import changes_range
from airflow_pglogrepl.merge.changes_range import InRange
from airflow_pglogrepl.tables import TableRef

T = TableRef("public", "t")


Model = dict[int, tuple[int | None, str | None]]


def changelog_schema(identity: str = "d", *, keyed: bool = True) -> pa.Schema:
    table = [
        pa.field("id", pa.int64(), metadata={KEY_META: "0"} if keyed else None),
        pa.field("v", pa.int64()),
        pa.field("big", pa.string()),
    ]
    return pa.schema(
        [
            *table,
            pa.field("_op", pa.string(), metadata={IDENTITY_META: identity}),
            pa.field("_commit_lsn", pa.int64()),
            pa.field("_seq", pa.int64()),
            pa.field("_unchanged", pa.list_(pa.string())),
            pa.field("_old", pa.struct([pa.field(f.name, f.type) for f in table])),
        ]
    )


class Log:
    """Changelog rows of one batch, in commit order."""

    def __init__(self, lsn: int) -> None:
        self.rows: list[dict[str, Any]] = []
        self.lsn = lsn

    def add(self, op: str, id: int | None, v: int | None = None, big: str | None = None, *,
            unchanged: tuple[str, ...] = (),
            old: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.lsn += 0x10
        self.rows.append({"id": id, "v": v, "big": big, "_op": op, "_commit_lsn": self.lsn,
                          "_seq": 0, "_unchanged": list(unchanged), "_old": old})  # fmt: skip

    def table(self, identity: str = "d") -> pa.Table:
        return pa.Table.from_pylist(self.rows, schema=changelog_schema(identity))


def state_table(lake: Lake, rows: Model, at: int) -> None:
    """A state as Spark or a snapshot would have left it, committed at ``at``."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    schema = pa.schema([f for f in changelog_schema() if not f.name.startswith("_")])
    data = pa.Table.from_pylist(
        [{"id": k, "v": v, "big": b} for k, (v, b) in rows.items()], schema=schema
    )
    write_deltalake(lake.paths.state(T), data, commit_properties=CommitProperties(
        app_transactions=[Transaction(lake.app, at)]))  # fmt: skip


def commit(lake: Lake, log: Log, start: int, identity: str = "d") -> LSN:
    end = LSN(log.lsn + 0x10)
    window = Window(lake, LSN(start))
    window.write(T, log.table(identity))
    window.commit(end, transactions=len(log.rows), changes=len(log.rows))
    return end


def state(lake: Lake) -> Model:
    return {r["id"]: (r["v"], r["big"]) for r in read_table(lake.paths.state(T)).to_pylist()}


def play(rng: random.Random, model: Model, log: Log, steps: int) -> None:
    """Random inserts, updates (some with the big column an unchanged TOAST value, some
    inserting over an existing row), deletes and re-inserts of deleted keys, into ``model``."""
    for _ in range(steps):
        key = rng.randrange(1, 15)
        roll = rng.random()
        if key not in model or roll < 0.1:
            value = (rng.randrange(1000), rng.choice(["x" * 20, "y", None]))
            log.add("I", key, *value)
            model[key] = value
        elif roll < 0.7:
            v = rng.randrange(1000)
            if rng.random() < 0.5:
                log.add("U", key, v, None, unchanged=("big",))
                model[key] = (v, model[key][1])
            else:
                big = rng.choice(["z" * 30, None])
                log.add("U", key, v, big)
                model[key] = (v, big)
        else:
            log.add("D", key)
            del model[key]


@pytest.mark.parametrize("seed", range(20))
def test_a_first_state_is_one_append_of_the_net_change(tmp_path: Path, seed: int) -> None:
    """No state table yet (a lake begun by a drain, no snapshot): the batch's net change creates
    it, with deletion vectors on as Spark's path creates it; later batches merge into it."""
    from deltalake import DeltaTable

    rng = random.Random(seed)
    lake = Lake(str(tmp_path / "lake"), "s")
    model: Model = {}
    log = Log(0x100)
    play(rng, model, log, rng.randrange(1, 60))
    end = commit(lake, log, 0x100)
    assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": str(end)}, [])
    assert state(lake) == model
    table = DeltaTable(lake.paths.state(T))
    assert table.version() == 0 and table.transaction_version(lake.app) == int(end)
    assert table.metadata().configuration == {
        "delta.enableDeletionVectors": "true",
        "delta.enableExpiredLogCleanup": "false",  # only the upkeep cleans logs
    }
    protocol = table.protocol()  # no feature a column does not need (no variantType)
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert protocol.reader_features == ["deletionVectors"]  # the writer's: Spark's too
    assert protocol.writer_features == ["deletionVectors", "invariants", "appendOnly"]
    assert len(table.file_uris()) == (1 if model else 0)
    assert [f.name for f in table.schema().fields] == ["id", "v", "big"]
    assert arrow_merge.merge_table(lake, "public.t", end) is None  # a replay: nothing
    assert DeltaTable(lake.paths.state(T)).version() == 0
    log = Log(int(end))
    play(rng, model, log, 20)
    later = commit(lake, log, int(end))
    assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": str(later)}, [])
    assert state(lake) == model


def test_a_keyed_batch_too_big_to_read_here_goes_to_spark_unreduced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Into an existing state, a batch above ``READ_BYTES`` is neither merged nor reduced here:
    Spark reads it from the changelog (a reduced batch reaches Spark through the driver's heap,
    where 40,000 rows of 16 KiB hung the merge)."""
    lake = Lake(str(tmp_path / "lake"), "s")
    state_table(lake, {1: (1, "a")}, 0x100)
    lake.record(kind="snapshot", start=LSN(0x100), end=LSN(0x100))
    log = Log(0x100)
    for key in range(20):
        log.add("U", 1, key, "x" * 1000)
    commit(lake, log, 0x100)
    monkeypatch.setattr(arrow_merge, "READ_BYTES", 10_000)
    monkeypatch.setattr(arrow_merge, "MAX_STATE_BYTES", 0)  # a state "too big" to rewrite here
    reduced: dict[str, arrow_merge.Reduced] = {}
    merged, declined = arrow_merge.merge_small(lake, ["public.t"], reduced=reduced)
    assert (merged, declined, reduced) == ({}, ["public.t"], {})
    monkeypatch.setattr(arrow_merge, "READ_BYTES", 10_000_000)
    arrow_merge.merge_small(lake, ["public.t"], reduced=reduced)
    assert list(reduced) == ["public.t"]  # below it, reduced here as before


def test_what_is_read_into_memory_is_bounded_by_the_bytes_read_not_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Small rows first, then big identical values (which Parquet stores as one dictionary
    entry: its row groups look small): the estimate says little, the read finds more. Into a
    state the batch goes to Spark unreduced; as a first state it goes through buckets."""
    import logging

    from deltalake import DeltaTable

    from airflow_pglogrepl.merge import buckets

    monkeypatch.setattr(changes_range, "SAMPLE_ROWS", 10)
    monkeypatch.setattr(changes_range, "BATCH_BYTES", 20_000)
    monkeypatch.setattr(arrow_merge, "READ_BYTES", 100_000)
    monkeypatch.setattr(arrow_merge, "IN_MEMORY_BYTES", 100_000)
    monkeypatch.setenv(buckets.FOLDER_ENV, str(tmp_path / "buckets"))
    for first in (False, True):
        lake = Lake(str(tmp_path / f"lake{first}"), "s")
        if not first:
            state_table(lake, {1: (1, "a")}, 0x100)
            lake.record(kind="snapshot", start=LSN(0x100), end=LSN(0x100))
        log = Log(0x100)
        for key in range(20):
            log.add("I", key + 10, key, "s")
        for key in range(20):
            log.add("I", key + 100, key, "b" * 10_000)
        end = commit(lake, log, 0x100)
        in_range = InRange(DeltaTable(lake.paths.changes(T)), log.table().schema, None, int(end))
        assert in_range.size_bytes(["id", "v", "big"]) < 100_000  # the estimate is low
        reduced: dict[str, arrow_merge.Reduced] = {}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="airflow_pglogrepl.lake"):
            merged, declined = arrow_merge.merge_small(lake, ["public.t"], reduced=reduced)
        if first:
            assert merged == {"public.t": str(end)} and "in 2 buckets" in caplog.text
            assert len(state(lake)) == 40
        else:
            assert (merged, declined, reduced) == ({}, ["public.t"], {})
            assert "more than 0 MiB" in caplog.text  # (READ_BYTES is 100,000 here)


def test_a_first_state_bigger_than_a_merge_batch_is_still_written_here(tmp_path: Path) -> None:
    """Memory bounds an append (``IN_MEMORY_ROWS``, then buckets); ``max_rows`` bounds merges, which
    rewrite files. ``max_rows=0`` still sends everything to Spark."""
    lake = Lake(str(tmp_path / "lake"), "s")
    log = Log(0x100)
    for key in range(50):
        log.add("I", key, key, "a")
    end = commit(lake, log, 0x100)
    assert arrow_merge.merge_small(lake, ["public.t"], max_rows=0) == ({}, ["public.t"])
    assert txn_version(lake.paths.state(T), lake.app) is None
    assert arrow_merge.merge_small(lake, ["public.t"], max_rows=10) == ({"public.t": str(end)}, [])
    assert len(state(lake)) == 50


def test_a_first_state_whose_update_keeps_a_toast_value_of_no_row_fails(tmp_path: Path) -> None:
    """With no state at all, an update that left a TOAST value unchanged has no value to keep."""
    lake = Lake(str(tmp_path / "lake"), "s")
    log = Log(0x100)
    log.add("I", 1, 1, "a")
    log.add("U", 9, 2, None, unchanged=("big",))
    commit(lake, log, 0x100)
    with pytest.raises(LakeError, match=r"row 9 is neither in the state nor inserted earlier"):
        arrow_merge.merge_small(lake, ["public.t"])
    assert txn_version(lake.paths.state(T), lake.app) is None


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_end_as_the_sequential_model(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    lake = Lake(str(tmp_path / "lake"), "s")
    model: Model = {k: (k, "s" * k) for k in range(1, 8)}
    state_table(lake, model, 0x100)
    lake.record(kind="snapshot", start=LSN(0x100), end=LSN(0x100))
    start = 0x100
    for _ in range(4):
        log = Log(start)
        play(rng, model, log, rng.randrange(1, 30))
        end = commit(lake, log, start)
        merged, declined = arrow_merge.merge_small(lake, ["public.t"])
        assert declined == [] and merged == {"public.t": str(end)}
        assert state(lake) == model
        assert txn_version(lake.paths.state(T), lake.app) == int(end)
        assert arrow_merge.merge_table(lake, "public.t", end) is None  # a replay: nothing
        assert state(lake) == model
        start = int(end)


def test_a_batch_that_changes_nothing_still_moves_the_states_position(tmp_path: Path) -> None:
    """An insert and a delete of the same key net to nothing: delta-rs' MERGE then commits
    nothing, yet the state must record that it includes the batch (else it looks behind for
    ever: merged again every run, a consistent cut held back)."""
    from airflow_pglogrepl.merge.materialize import pending_tables

    lake = Lake(str(tmp_path / "lake"), "s")
    state_table(lake, {1: (1, "a")}, 0x100)
    lake.record(kind="snapshot", start=LSN(0x100), end=LSN(0x100))
    log = Log(0x100)
    log.add("I", 5, 5, "x")
    log.add("D", 5)
    end = commit(lake, log, 0x100)
    assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": str(end)}, [])
    assert txn_version(lake.paths.state(T), lake.app) == int(end)
    assert pending_tables(lake) == [] and state(lake) == {1: (1, "a")}
    empty = Lake(str(tmp_path / "first"), "s")  # a first state of nothing: an empty table
    log = Log(0x100)
    log.add("I", 5, 5, "x")
    log.add("D", 5)
    end = commit(empty, log, 0x100)
    assert arrow_merge.merge_small(empty, ["public.t"]) == ({"public.t": str(end)}, [])
    assert txn_version(empty.paths.state(T), empty.app) == int(end) and state(empty) == {}


def test_what_it_declines_is_left_untouched_for_spark(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    state_table(lake, {}, 0x100)
    end = LSN(0x100)
    log = Log(int(end))
    log.add("T", None)
    log.add("I", 2, 2, "b")
    end2 = commit(lake, log, int(end))
    assert arrow_merge.merge_table(lake, "public.t", end2) == "a TRUNCATE or a key change"
    other = Lake(str(tmp_path / "moved"), "s")
    state_table(other, {1: (1, "a")}, 0x100)
    log = Log(0x100)
    log.add("U", 5, 1, "a", old={"id": 1, "v": None, "big": None})  # the key 1 became 5
    moved = commit(other, log, 0x100)
    assert arrow_merge.merge_table(other, "public.t", moved) == "a TRUNCATE or a key change"
    full = Lake(str(tmp_path / "full"), "s")
    state_table(full, {}, 0x100)
    log = Log(0x100)
    log.add("I", 1, 1, "a")
    log.add("D", 1, 1, "a")
    assert "FULL" in str(arrow_merge.merge_table(full, "public.t", commit(full, log, 0x100, "f")))
    small = Lake(str(tmp_path / "small"), "s")
    state_table(small, {}, 0x100)
    log = Log(0x100)
    for key in range(5):
        log.add("I", key, key, "a")
    why = arrow_merge.merge_table(small, "public.t", commit(small, log, 0x100), max_rows=4)
    assert str(why).startswith("5 changes")
    hostile = Lake(str(tmp_path / "hostile"), "s")
    state_table(hostile, {}, 0x100)
    log = Log(0x100)
    log.add("I", 1, 1, "a")
    rows = log.table().rename_columns(["id", "__pglr_delete", *log.table().column_names[2:]])
    window = Window(hostile, LSN(0x100))
    window.write(T, rows)
    window.commit(LSN(0x200), transactions=1, changes=1)
    assert "named like" in str(arrow_merge.merge_table(hostile, "public.t", LSN(0x200)))
    for declined in (lake, other, full, small, hostile):
        assert txn_version(declined.paths.state(T), declined.app) in (0x100, None)


def test_an_unchanged_toast_value_of_a_row_nowhere_fails_and_merges_nothing(
    tmp_path: Path,
) -> None:
    """As Spark's path does: a wrong current state is worse than a stopped one."""
    lake = Lake(str(tmp_path / "lake"), "s")
    state_table(lake, {1: (1, "a")}, 0x100)
    log = Log(0x100)
    log.add("U", 1, 2, None, unchanged=("big",))  # fine: the state has row 1
    log.add("U", 7, 2, None, unchanged=("big",))  # row 7 is nowhere
    commit(lake, log, 0x100)
    with pytest.raises(LakeError, match=r"row 7 is neither in the state nor inserted earlier"):
        arrow_merge.merge_small(lake, ["public.t"])  # raised, not handed to Spark
    assert state(lake) == {1: (1, "a")}
    assert txn_version(lake.paths.state(T), lake.app) == 0x100


# Against a live source and Spark: every type the lake stores, on states Spark made (deletion
# vectors), then merged by Spark again after this path.


@pytest.mark.spark
def test_small_batches_merge_without_a_jvm_into_states_spark_made_and_back(
    spark: Any, source: Any, lake_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from tests.support.drain import (
        TYPED_TABLE,
        assert_state_equals_source,
        drain_in_process,
        insert_sql,
        random_row,
    )

    rng = random.Random(7)
    source.sql(TYPED_TABLE.format(name="typed"))
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE typed")
    for key in range(200):
        source.sql(insert_sql("typed"), random_row(rng, key, big=key % 4 == 0))
    lake_root = lake_uri
    ref = TableRef("public", "typed")
    drain_in_process(
        spark, source, lake_root, window=1 << 20, small_rows=0
    )  # a first state by Spark
    assert_state_equals_source(source, lake_root, ref)

    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.lake")
    caplog.clear()
    for step in range(3):  # updates that leave the TOASTed column unchanged, deletes, inserts
        source.sql("UPDATE typed SET i = i + 1, t = %s WHERE id %% 7 = %s", (f"s{step}", step))
        source.sql("DELETE FROM typed WHERE id %% 23 = %s", (step,))
        for key in range(1000 + step * 10, 1005 + step * 10):
            source.sql(insert_sql("typed"), random_row(rng, key, big=True))
        result = drain_in_process(spark, source, lake_root, window=1 << 20)
        assert result["materialized"] == {"public.typed": result["window_end_lsn"]}
        assert_state_equals_source(source, lake_root, ref)
    assert "merged up to" in caplog.text and "without a JVM" in caplog.text
    assert "merged by Spark" not in caplog.text

    source.sql("UPDATE typed SET id = -id WHERE id < 5")  # key changes: Spark's reduction
    caplog.clear()
    drain_in_process(spark, source, lake_root, window=1 << 20)
    assert "merged by Spark: a TRUNCATE or a key change" in caplog.text
    assert_state_equals_source(source, lake_root, ref)


@pytest.mark.spark
def test_full_identity_appends_here_then_spark_counts_copies_in_the_same_state(
    spark: Any, source: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A REPLICA IDENTITY FULL table whose identical rows (NULLs, -0.0, NaN among them) were
    appended without a JVM, first state included; then one copy updated and one deleted:
    Spark's multiset merge finds them in the files delta-rs wrote, and the state is the
    source's multiset."""
    import logging
    from collections import Counter

    from tests.support.drain import drain_in_process

    source.sql("CREATE TABLE audit (who text, n int, x float8)")
    source.sql("ALTER TABLE audit REPLICA IDENTITY FULL")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE audit")
    rows = "('a', 1, 0.5), ('a', 1, 0.5), (NULL, NULL, NULL), (NULL, NULL, NULL), ('b', 2, 'NaN')"
    lake_root = str(tmp_path / "lake")
    path = f"{lake_root}/state/public.audit"

    def lake_and_source() -> tuple[Counter[Any], Counter[Any]]:
        def key(row: Any) -> tuple[Any, ...]:
            return tuple("NaN" if isinstance(v, float) and v != v else v for v in row)

        lake = Counter(key((r["who"], r["n"], r["x"])) for r in read_table(path).to_pylist())
        return lake, Counter(key(r) for r in source.sql("SELECT who, n, x FROM audit"))

    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.lake")
    for _ in range(2):  # a first state, then an append to it
        source.sql(f"INSERT INTO audit VALUES {rows}, ('c', 3, '-0')")
        caplog.clear()
        drain_in_process(spark, source, lake_root, window=1 << 20)
        assert "appended up to" in caplog.text and "merged by Spark" not in caplog.text
        lake, expected = lake_and_source()
        assert lake == expected and sum(lake.values()) > 0

    source.sql("UPDATE audit SET n = 9 WHERE ctid = (SELECT min(ctid) FROM audit WHERE who = 'a')")
    source.sql("DELETE FROM audit WHERE ctid = (SELECT max(ctid) FROM audit WHERE who IS NULL)")
    source.sql("DELETE FROM audit WHERE ctid = (SELECT min(ctid) FROM audit WHERE who = 'b')")
    caplog.clear()
    drain_in_process(spark, source, lake_root, window=1 << 20)
    assert "merged by Spark: REPLICA IDENTITY FULL, updates or deletes" in caplog.text
    lake, expected = lake_and_source()
    assert lake == expected
    assert expected[("a", 1, 0.5)] == 3 and expected[("a", 9, 0.5)] == 1


@pytest.mark.spark
def test_a_first_state_written_here_takes_spark_merges_and_small_ones_after(
    spark: Any, source: Any, lake_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every type the typed table holds, in a first state written without a JVM; then a key
    change Spark merges into it (deletion vectors in a table delta-rs created); then a small
    batch merged here again, over those vectors."""
    import logging

    from tests.support.drain import (
        TYPED_TABLE,
        assert_state_equals_source,
        drain_in_process,
        insert_sql,
        random_row,
    )

    rng = random.Random(11)
    source.sql(TYPED_TABLE.format(name="typed"))
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE typed")
    for key in range(300):
        source.sql(insert_sql("typed"), random_row(rng, key, big=key % 5 == 0))
    source.sql("UPDATE typed SET i = i + 1 WHERE id % 3 = 0")
    source.sql("DELETE FROM typed WHERE id % 11 = 0")
    lake_root = lake_uri
    ref = TableRef("public", "typed")
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.lake")
    drain_in_process(spark, source, lake_root, window=1 << 20)
    assert "state of public.typed written up to" in caplog.text
    assert_state_equals_source(source, lake_root, ref)

    caplog.clear()
    source.sql("UPDATE typed SET id = -id WHERE id BETWEEN 1 AND 40")  # key changes: Spark's
    drain_in_process(spark, source, lake_root, window=1 << 20)
    assert "merged by Spark: a TRUNCATE or a key change" in caplog.text
    assert_state_equals_source(source, lake_root, ref)

    caplog.clear()
    source.sql("UPDATE typed SET t = 'again' WHERE id % 2 = 0")
    source.sql("DELETE FROM typed WHERE id < -30")
    drain_in_process(spark, source, lake_root, window=1 << 20)
    assert "without a JVM" in caplog.text and "merged by Spark" not in caplog.text
    assert_state_equals_source(source, lake_root, ref)


# A state too big for delta-rs' copy-on-write MERGE: the batch is reduced here, Spark merges it.


@pytest.mark.spark
def test_a_big_states_batch_is_reduced_here_and_merged_by_spark(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from airflow_pglogrepl.merge.materialize import materialize

    monkeypatch.setattr(arrow_merge, "MAX_STATE_BYTES", 0)  # every state is "big"
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.lake")
    rng = random.Random(5)
    lake = Lake(str(tmp_path / "lake"), "s")
    model: Model = {k: (k, "s" * k) for k in range(1, 8)}
    state_table(lake, model, 0x100)
    lake.record(kind="snapshot", start=LSN(0x100), end=LSN(0x100))
    start = 0x100
    for _ in range(3):
        log = Log(start)
        play(rng, model, log, rng.randrange(10, 30))
        end = commit(lake, log, start)
        assert materialize(spark, lake) == {"public.t": str(end)}
        assert state(lake) == model
        assert txn_version(lake.paths.state(T), lake.app) == int(end)
        start = int(end)
    assert caplog.text.count("by Spark, reduced without it") == 3

    log = Log(start)
    log.add("U", 99, 1, None, unchanged=("big",))  # row 99 is nowhere: Spark's raise_error
    commit(lake, log, start)
    with pytest.raises(Exception, match="unchanged TOAST value of column 'big'"):
        materialize(spark, lake)
    assert txn_version(lake.paths.state(T), lake.app) == start and state(lake) == model


def test_a_reduced_batch_whose_state_moved_since_is_refused(tmp_path: Path) -> None:
    """Reduced against one state version, merged only onto that one (a compare-and-set)."""
    from airflow_pglogrepl.exceptions import LakeCommitConflictError
    from airflow_pglogrepl.merge.materialize import merge_reduced

    lake = Lake(str(tmp_path / "lake"), "s")
    state_table(lake, {1: (1, "a")}, 0x200)
    moved = arrow_merge.Reduced("public.t", LSN(0x300), 0x100, ("id",), ("v", "big"),
                                pa.table({"id": [1]}), 1)  # fmt: skip
    with pytest.raises(LakeCommitConflictError):
        merge_reduced(None, lake, moved)
    done = arrow_merge.Reduced("public.t", LSN(0x200), 0x100, ("id",), ("v",), pa.table({}), 0)
    assert merge_reduced(None, lake, done) == LSN(0x200)  # merged already: nothing to do


def test_a_table_without_a_key_has_its_inserts_appended(tmp_path: Path) -> None:
    """No replica identity: only inserts and truncates reach the lake, the state is a multiset
    (duplicate rows stay duplicates). Inserts alone are appended here, first state included, a
    compare-and-set on the state's version; a TRUNCATE goes to Spark."""
    from deltalake import DeltaTable

    from airflow_pglogrepl.exceptions import LakeCommitConflictError

    lake = Lake(str(tmp_path / "lake"), "s")
    expected: list[tuple[Any, ...]] = []
    start = 0x100
    for round_ in range(3):
        log = Log(start)
        for n in range(5):
            log.add("I", n % 2, round_, "dup" if n % 2 else None)  # duplicate rows
            expected.append((n % 2, round_, "dup" if n % 2 else None))
        end = LSN(log.lsn + 0x10)
        window = Window(lake, LSN(start))
        window.write(T, log.table().cast(changelog_schema(keyed=False)))
        window.commit(end, transactions=5, changes=5)
        assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": str(end)}, [])
        rows = read_table(lake.paths.state(T)).to_pylist()
        assert sorted((r["id"], r["v"], r["big"]) for r in rows) == sorted(expected)
        assert txn_version(lake.paths.state(T), lake.app) == int(end)
        start = int(end)
    assert len(DeltaTable(lake.paths.state(T)).file_uris()) == 3  # three appends, none rewritten

    log = Log(start)
    log.add("T", None)
    log.add("I", 7, 7, "after")
    window = Window(lake, LSN(start))
    window.write(T, log.table().cast(changelog_schema(keyed=False)))
    window.commit(LSN(log.lsn + 0x10), transactions=2, changes=2)
    assert arrow_merge.merge_table(lake, "public.t", LSN(log.lsn + 0x10)) == (
        "a table without a key whose batch is not only inserts (a TRUNCATE)"
    )

    raced = Lake(str(tmp_path / "raced"), "s")  # the state moved after it was read
    log = Log(0x100)
    log.add("I", 1, 1, "a")
    window = Window(raced, LSN(0x100))
    window.write(T, log.table().cast(changelog_schema(keyed=False)))
    window.commit(LSN(0x200), transactions=1, changes=1)
    arrow_merge.merge_small(raced, ["public.t"])
    log = Log(0x200)
    log.add("I", 2, 2, "b")
    window = Window(raced, LSN(0x200))
    window.write(T, log.table().cast(changelog_schema(keyed=False)))
    window.commit(LSN(0x300), transactions=1, changes=1)
    stale = DeltaTable(raced.paths.state(T))
    from deltalake import CommitProperties, Transaction, write_deltalake

    write_deltalake(raced.paths.state(T), pa.table({"id": [9], "v": [9], "big": ["x"]}),
                    mode="append", commit_properties=CommitProperties(
                        app_transactions=[Transaction(raced.app, 0x250)]))  # fmt: skip
    changes = DeltaTable(raced.paths.changes(T))
    plan = arrow_merge._plan(stale, stale.transaction_version(raced.app), changes, 100)
    assert not isinstance(plan, str)
    in_range = InRange(changes, plan.schema, plan.have, 0x300)
    with pytest.raises(LakeCommitConflictError):
        arrow_merge._append(raced, "public.t", LSN(0x300), stale, in_range, plan)


def full_identity(log: Log, lake: Lake, start: int) -> LSN:
    """``log`` committed as the drain writes a REPLICA IDENTITY FULL table: every column is
    part of the identity (pgoutput flags each one)."""
    schema = changelog_schema("f")
    marked = [f.with_metadata({KEY_META: str(i)}) if i < 3 else f for i, f in enumerate(schema)]
    end = LSN(log.lsn + 0x10)
    window = Window(lake, LSN(start))
    window.write(T, pa.Table.from_pylist(log.rows, schema=pa.schema(marked)))
    window.commit(end, transactions=len(log.rows), changes=len(log.rows))
    return end


def test_inserts_under_replica_identity_full_are_appended_as_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REPLICA IDENTITY FULL: the state is a multiset of whole rows, so a batch of inserts adds
    one copy of each (duplicates too) without a JVM, first state included; an update, a delete
    or a TRUNCATE is declined for Spark, known from the ``_op`` column alone (a batch of a
    million updates is not read here to be declined), and the state stays as it was."""
    lake = Lake(str(tmp_path / "lake"), "s")
    expected: list[tuple[Any, ...]] = []
    start = 0x100
    for round_ in range(2):
        log = Log(start)
        for n in range(4):
            log.add("I", n % 2, round_, "same")  # each row twice per round
            expected.append((n % 2, round_, "same"))
        end = full_identity(log, lake, start)
        assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": str(end)}, [])
        rows = read_table(lake.paths.state(T)).to_pylist()
        assert sorted((r["id"], r["v"], r["big"]) for r in rows) == sorted(expected)
        assert txn_version(lake.paths.state(T), lake.app) == int(end)
        start = int(end)
    merged = start
    read: list[list[str]] = []
    real_batches = InRange.batches
    monkeypatch.setattr(InRange, "batches", lambda self, columns: (
        read.append(list(columns)), real_batches(self, columns))[1])  # fmt: skip
    for op, why in (("U", "updates or deletes"), ("D", "updates or deletes"), ("T", "TRUNCATE")):
        log = Log(start)
        log.add("I", 9, 9, "new")
        log.add(op, 0, 0, "same", old={"id": 0, "v": 0, "big": "same"})
        end = full_identity(log, lake, start)
        read.clear()
        reason = arrow_merge.merge_table(lake, "public.t", end)
        assert reason is not None and "REPLICA IDENTITY FULL" in reason and why in reason
        assert read == [["_op"]]  # declined before the batch was read
        assert txn_version(lake.paths.state(T), lake.app) == merged  # nothing written
        assert len(read_table(lake.paths.state(T))) == len(expected)
        start = int(end)


def test_a_batch_with_no_change_in_range_records_the_position_without_spark(
    tmp_path: Path,
) -> None:
    """A changelog ahead of the position (a crashed run's commit, replayed with smaller
    windows) can hold no row below it: nothing to merge, yet the state moves to the position
    here (it went to Spark, which started a JVM for nothing)."""
    from airflow_pglogrepl.lake import delta

    lake = Lake(str(tmp_path / "lake"), "s")
    state_table(lake, {1: (1, "a")}, 0x100)
    lake.record(kind="snapshot", start=LSN(0x100), end=LSN(0x100))
    log = Log(0x240)
    log.add("I", 2, 2, "b")  # commit LSN 0x250: past the position below
    written = delta.write_file(lake.paths.changes(T), log.table(), prefix="crashed")
    delta.commit_files(lake.paths.changes(T), log.table().schema, [written], app=lake.app,
                       version=0x300, expected=None)  # fmt: skip
    lake.record(kind="window", start=LSN(0x100), end=LSN(0x200))
    assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": "0/200"}, [])
    assert txn_version(lake.paths.state(T), lake.app) == 0x200 and state(lake) == {1: (1, "a")}
    lake.record(kind="window", start=LSN(0x200), end=LSN(0x300))
    assert arrow_merge.merge_small(lake, ["public.t"]) == ({"public.t": "0/300"}, [])
    assert state(lake) == {1: (1, "a"), 2: (2, "b")}
