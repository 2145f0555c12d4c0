"""The online backfill: what the WAL does not carry, copied in chunks while the drain goes on,
equal to the source after it, and never paused for.

Before: a table added holding rows was re-snapshotted whole in the run (every window waited
for the copy); and a state damaged by hand had no repair at all short of a new lake."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.lake import backfill as record
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import (
    all_changelog_keys,
    assert_state_equals_source,
    drain_app,
    drain_in_process,
    start_drain_app,
    summary,
)
from tests.support.partitions import attach_and_detach_under_the_root
from tests.support.sources import Source

WINDOW = 1 << 20
B = TableRef("public", "b")


def _drain(spark: Any, source: Source, lake_root: str, **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("backfill_rows", 100)  # a few chunks of the tables below
    return drain_in_process(spark, source, lake_root, window=WINDOW, **kwargs)


def _around_each_chunk(
    monkeypatch: pytest.MonkeyPatch,
    *,
    before: Callable[[], None] = lambda: None,
    after: Callable[[int], None] = lambda copied: None,
) -> None:
    """Run ``before`` as each backfill chunk begins, and ``after`` (given how many chunks were
    copied) once it is copied: what the source does between chunks."""
    from airflow_pglogrepl.spark import backfill

    copy, copied = backfill.OnlineBackfill._copy_chunk, [0]

    def copy_between(self: Any, plan: Any) -> Any:
        before()
        found = copy(self, plan)
        copied[0] += 1
        after(copied[0])
        return found

    monkeypatch.setattr(backfill.OnlineBackfill, "_copy_chunk", copy_between)


def _added_table(source: Source, rows: int) -> None:
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text, pad text)")
    source.sql(f"INSERT INTO b SELECT g, 'b', repeat('x', 200) FROM generate_series(1, {rows}) g")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")


def _first_lake(spark: Any, source: Source, lake_root: str) -> None:
    source.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE a")
    source.sql("INSERT INTO a SELECT g, 'a' FROM generate_series(1, 10) g")
    assert _drain(spark, source, lake_root)["incomplete"] == {}


def _drained_root(spark: Any, source: Source, lake_root: str, *, value: str = "'x'") -> None:
    """A root published via itself with one partition of 300 rows (``v``: ``value``), drained:
    the lake holds it whole."""
    source.sql("CREATE TABLE parted (id int, region text, v text, PRIMARY KEY (id, region))"
               " PARTITION BY LIST (region)")  # fmt: skip
    source.sql("CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE parted"
               " WITH (publish_via_partition_root = true)")  # fmt: skip
    source.sql(f"INSERT INTO parted SELECT g, 'us', {value} FROM generate_series(1, 300) g")
    _drain(spark, source, lake_root)


def test_a_table_added_holding_rows_is_backfilled_in_chunks_while_the_run_drains(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    _added_table(source, 300)
    source.sql("INSERT INTO b SELECT g, 'b', 'y' FROM generate_series(301, 350) g")
    source.sql("UPDATE b SET v = 'u' WHERE id <= 20 OR id > 340")
    result = _drain(spark, source, lake_root)
    assert result["incomplete"] == {}
    assert result["backfills"] == {"public.b": {"built": True}}
    assert_state_equals_source(source, lake_root, B)
    lake = Lake(lake_root, source.slot)
    assert record.read(lake).plans == {}  # done: the record and the chunks are gone
    assert not (tmp_path / "lake" / "_pglogrepl" / "backfill" / f"{table_dir(B)}").exists()
    source.sql("UPDATE b SET v = 'after' WHERE id > 300; DELETE FROM b WHERE id < 5")
    assert _drain(spark, source, lake_root)["backfills"] == {}  # once: nothing left to do
    assert_state_equals_source(source, lake_root, B)


def test_chunks_and_the_build_go_on_while_windows_commit_and_the_state_appears_whole(
    spark: Any, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While each chunk is copied, and while the state is built, changes committed to other
    tables reach the lake (the drain goes on), and the table's state keeps what it had until
    its state is built whole. Each chunk and the build wait (up to 30 s) for a change
    committed as they begin to reach the lake: before, run between two windows, they held
    the drain (a chunk a few seconds, the build 20 s for 2 million rows in
    bench/bench_backfill.py) and the waits timed out."""
    from airflow_pglogrepl.spark import backfill_state
    from tests.support.drain import changelog, lake_table

    lake_root = str(tmp_path / "lake")
    a = TableRef("public", "a")
    _first_lake(spark, source, lake_root)
    _added_table(source, 300)
    source.sql("INSERT INTO b VALUES (1000, 'streamed', 'z')")
    _drain(spark, source, lake_root, backfill_rows=None)  # only reported: b's state is 1 row
    inserted, in_time, state_of_b = [100], [], []

    def until_a_window_committed_it() -> None:
        """A change to ``a`` committed now, waited for in the lake (True: it came in time)."""
        inserted[0] += 1
        source.sql(f"INSERT INTO a VALUES ({inserted[0]}, 'during a backfill step')")
        deadline = time.monotonic() + 30
        while inserted[0] not in {r["id"] for r in changelog(lake_root, a)}:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        in_time.append(time.monotonic() <= deadline)
        state_of_b.append(len(lake_table(lake_root, "b")))

    _around_each_chunk(monkeypatch, before=until_a_window_committed_it)
    real_build = backfill_state.build_state

    def build_while_a_window_commits(*args: Any, **kwargs: Any) -> None:
        until_a_window_committed_it()
        real_build(*args, **kwargs)

    monkeypatch.setattr(backfill_state, "build_state", build_while_a_window_commits)
    result = _drain(spark, source, lake_root, backfill_rows=40)
    assert len(in_time) >= 5, in_time  # several chunks, and the build
    assert in_time == [True] * len(in_time)  # a window committed during each of them
    assert state_of_b == [1] * len(state_of_b)  # the state of b unchanged meanwhile
    assert result["backfills"] == {"public.b": {"built": True}}
    assert_state_equals_source(source, lake_root, B)
    assert_state_equals_source(source, lake_root, a)


def test_partitions_attached_or_detached_under_the_root_are_backfilled(
    spark: Any, source: Source, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The root is copied in chunks too, each the same blocks of every leaf (before: in one,
    whatever its size, holding one snapshot open the whole copy)."""
    lake_root = str(tmp_path / "lake")
    caplog.set_level("INFO", logger="airflow_pglogrepl.backfill")
    attached, _ = attach_and_detach_under_the_root(
        source, lake_root, lambda: _drain(spark, source, lake_root)
    )
    assert "public.parted" in attached["backfills"]
    said = [r.getMessage() for r in caplog.records]
    chunks = [m for m in said if m.startswith("public.parted: backfill chunk")]
    assert any("chunk 2 " in m for m in chunks), chunks


def test_a_table_without_a_key_or_on_a_standby_is_re_snapshotted_instead(
    spark: Any, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyless table's state is a multiset, which rows read at different times cannot build;
    a standby has no WAL insert position for a backfill to begin at (simulated: the call
    raises what PostgreSQL says there). Before (a review found the second): every run
    reported the table as failed, and nothing re-snapshotted it."""
    import psycopg

    from airflow_pglogrepl.spark import backfill

    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    source.sql("CREATE TABLE b (id int, v text); ALTER TABLE b REPLICA IDENTITY FULL")
    source.sql("INSERT INTO b SELECT g % 7, 'same' FROM generate_series(1, 70) g")
    source.sql("CREATE TABLE c (id int PRIMARY KEY, v text)")
    source.sql("INSERT INTO c SELECT g, 'c' FROM generate_series(1, 30) g")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b, c")

    def on_a_standby(*args: Any, **kwargs: Any) -> None:
        raise psycopg.errors.ObjectNotInPrerequisiteState("recovery is in progress")

    monkeypatch.setattr(backfill, "backfill_start", on_a_standby)
    result = _drain(spark, source, lake_root)
    assert result["incomplete"] == {} and result["backfills"] == {}
    assert_state_equals_source(source, lake_root, B)
    assert_state_equals_source(source, lake_root, TableRef("public", "c"))


def test_a_rewrite_between_chunks_begins_the_backfill_again(
    spark: Any,
    source: Source,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """VACUUM FULL moves rows between heap blocks: chunks read before and after it could miss
    a row or read one twice, so the backfill starts over, and the state is still equal."""
    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    _added_table(source, 300)
    source.sql("DELETE FROM b WHERE id % 3 = 0")
    done: list[int] = []

    def rewrite_after_two(copied: int) -> None:
        done.append(copied)
        if copied == 2:
            source.sql("VACUUM FULL b")

    _around_each_chunk(monkeypatch, after=rewrite_after_two)
    result = _drain(spark, source, lake_root, backfill_rows=40)
    assert result["incomplete"] == {}
    assert "the backfill begins again: its heap was rewritten" in caplog.text
    assert len(done) > 2 + 300 * 2 // 3 // 40  # the chunks before the rewrite, then all again
    assert_state_equals_source(source, lake_root, B)


def test_a_resync_of_a_damaged_state_removes_phantoms_and_restores_rows(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    from tests.support.drain import lake_table

    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text, pad text)")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
    source.sql("INSERT INTO b SELECT g, 'b', 'p' FROM generate_series(1, 200) g")
    _drain(spark, source, lake_root)
    assert_state_equals_source(source, lake_root, B)
    state = f"{lake_root}/state/{table_dir(B)}"
    damaged = spark.read.format("delta").load(state)
    extra = damaged.limit(5).selectExpr("id + 100000 AS id", "v", "pad")
    spark.sql(f"DELETE FROM delta.`{state}` WHERE id <= 30")
    extra.write.format("delta").mode("append").save(state)
    assert len(lake_table(lake_root, "b")) == 200 - 30 + 5
    source.sql("UPDATE b SET v = 'during' WHERE id % 10 = 0")
    result = _drain(spark, source, lake_root, backfill_rows=None, resync=["public.b"])
    assert result["backfills"] == {"public.b": {"built": True}}
    assert_state_equals_source(source, lake_root, B)


@pytest.mark.timeout(900)
def test_a_backfill_killed_twice_under_a_random_writer_finishes_equal(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """The application as a real process: killed in its third chunk (exit 137, nothing cleaned
    up), then by SIGKILL in the middle of another chunk, while a writer inserts, updates and
    deletes rows of the table at random; the third run finishes. The state equals the source
    and the changelog holds no change twice."""
    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    _added_table(source, 1200)  # four chunks of 300
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        rng = random.Random(41)
        while not stop.is_set():
            key = rng.randint(1, 1600)
            action = rng.choice(("insert", "update", "update", "delete"))
            if action == "insert":
                source.sql("INSERT INTO b VALUES (%s, 'w', 'new') ON CONFLICT (id) DO UPDATE "
                           "SET v = 'upsert'", (key,))  # fmt: skip
            elif action == "update":
                source.sql("UPDATE b SET v = %s WHERE id = %s", (f"w{writes[0]}", key))
            else:
                source.sql("DELETE FROM b WHERE id = %s", (key,))
            writes[0] += 1
            stop.wait(0.005)  # a steady writer, not a flood of windows to drain

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    chunk = ("--backfill-chunk-rows", "300", "--max-window-bytes", "65536")
    try:
        first = drain_app(source, lake_root, *chunk, fault="backfill_copying:3")
        assert first.returncode == 137, first.stderr[-2000:]
        lake = Lake(lake_root, source.slot)
        plan = record.read(lake).plans["public.b"]
        assert record.chunks_done(lake, plan) == 2
        pause = tmp_path / "pause"
        pause.mkdir()
        second = start_drain_app(source, lake_root, *chunk, pause=pause,
                                 pause_at="backfill_copying")  # fmt: skip
        deadline = time.monotonic() + 300
        while not list(pause.glob("backfill_copying.*")) and time.monotonic() < deadline:
            assert second.poll() is None, second.communicate()[1][-2000:]
            time.sleep(0.1)  # polled: the file appears when the run reaches the chunk
        assert list(pause.glob("backfill_copying.*"))
        os.killpg(second.pid, signal.SIGKILL)
        second.communicate()
        assert record.chunks_done(lake, record.read(lake).plans["public.b"]) >= 2
        third = summary(drain_app(source, lake_root, *chunk))
        assert third["backfills"]["public.b"] == {"built": True}, third["backfills"]
    finally:
        stop.set()
        thread.join()
    assert writes[0] > 100
    _drain(spark, source, lake_root)  # what the writer did after the build
    assert_state_equals_source(source, lake_root, B)
    keys = all_changelog_keys(lake_root, [B])
    assert len(keys) == len(set(keys))


def _block(source: Source, key: int) -> int:
    return int(source.sql("SELECT (ctid::text::point)[0] FROM b WHERE id = %s", (key,))[0][0])


def test_a_row_moved_into_a_copied_block_is_read_again_in_one_snapshot(
    spark: Any,
    source: Source,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An UPDATE leaving a TOAST value unchanged moves row 300 out of a block no chunk read yet
    into one a chunk had read: no chunk holds it, and the merge has no value to keep. Before (a
    review found it): every run failed the same way, for ever, and so did every merge."""
    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text, big text)")
    source.sql("ALTER TABLE b ALTER big SET STORAGE EXTERNAL")
    source.sql("INSERT INTO b SELECT g, 'b', repeat('x', 200) FROM generate_series(1, 299) g")
    source.sql("INSERT INTO b VALUES (300, 'r', repeat('z', 5000))")
    home, key = _block(source, 300), 301
    while True:  # fill row 300's block: its next version cannot stay there
        source.sql("INSERT INTO b VALUES (%s, '', NULL)", (key,))
        if _block(source, key) != home:
            break
        key += 1
    source.sql("DELETE FROM b WHERE id <= 10")
    source.sql("VACUUM b")  # room in block 0
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
    moved: list[int] = []

    def move_row_300_once(copied: int) -> None:
        if not moved:
            source.sql("UPDATE b SET v = 'moved' WHERE id = 300")
            moved.append(_block(source, 300))

    _around_each_chunk(monkeypatch, after=move_row_300_once)
    result = _drain(spark, source, lake_root)
    assert moved[0] < home, (moved, home)  # into a block already copied
    assert "reading the table in one snapshot" in caplog.text
    assert result["incomplete"] == {} and result["backfills"] == {"public.b": {"built": True}}
    assert_state_equals_source(source, lake_root, B)


def test_a_table_re_snapshotted_during_its_backfill_keeps_the_snapshot(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """A re-snapshot (``snapshot_app --table``) while the backfill waits to be built: the drain
    then drops the table's changes before the snapshot's point, so a build from the older chunks
    would lose them. Before (a review found it): 50 rows silently differed from the source."""
    from airflow_pglogrepl.lake.coverage import Gap
    from airflow_pglogrepl.spark import backfill_state
    from airflow_pglogrepl.spark.resnapshot import Resnapshot

    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    _added_table(source, 300)
    real = backfill_state.build_state

    def failing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("an executor was lost")

    backfill_state.build_state = failing  # type: ignore[assignment]
    try:
        failed = _drain(spark, source, lake_root)
    finally:
        backfill_state.build_state = real  # type: ignore[assignment]
    assert "an executor was lost" in failed["incomplete"]["public.b"]["repair"]
    assert record.read(Lake(lake_root, source.slot)).plans["public.b"].high is not None
    source.sql("UPDATE b SET v = 'between' WHERE id <= 50")
    hook = source.hook()
    lake = Lake(lake_root, source.slot, origins=hook.column_origins)
    with hook.writer_lock(source.slot) as lock:
        lake.writer_check = lock.check
        Resnapshot(spark=lambda: spark, source=hook, lake=lake, slot=source.slot,
                   publications=[source.publication])({"public.b": Gap("public.b", "added", "",
                                                                          "", "")})  # fmt: skip
    assert record.read(lake).plans == {}  # the re-snapshot dropped the backfill
    for key in (500, 501):
        source.sql(f"INSERT INTO a VALUES ({key}, 'traffic')")
        assert _drain(spark, source, lake_root)["incomplete"] == {}
    assert_state_equals_source(source, lake_root, B)


def test_a_resync_that_cannot_be_done_fails_the_run_naming_it(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """Before (a review found it): a resync of a table not published, or without a key, was
    dropped with only a line in the summary's backfills, and the task succeeded. Now the first
    fails the run naming it, and the second is re-snapshotted whole."""
    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    source.sql(
        "CREATE TABLE nokey (v text); ALTER TABLE nokey REPLICA IDENTITY FULL;"
        f"ALTER PUBLICATION {source.publication} ADD TABLE nokey"
    )  # born published
    source.sql("INSERT INTO nokey SELECT 'same' FROM generate_series(1, 5)")
    assert _drain(spark, source, lake_root)["incomplete"] == {}
    state = f"{lake_root}/state/{table_dir(TableRef('public', 'nokey'))}"
    spark.sql(f"DELETE FROM delta.`{state}`")  # damaged by hand
    result = _drain(spark, source, lake_root, resync=["public.unpublished", "public.nokey"])
    assert set(result["incomplete"]) == {"public.unpublished"}
    assert "not published" in result["incomplete"]["public.unpublished"]["repair"]
    assert_state_equals_source(source, lake_root, TableRef("public", "nokey"))


def _resync_left_unbuilt(
    spark: Any, source: Source, lake_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lake with table ``b`` drained, and a resync of it whose chunks are copied but whose
    state could not be built (an executor lost): the backfill stays in progress."""
    from airflow_pglogrepl.spark import backfill_state

    _first_lake(spark, source, lake_root)
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text, pad text);"
               f"ALTER PUBLICATION {source.publication} ADD TABLE b")  # fmt: skip
    source.sql("INSERT INTO b SELECT g, 'b', 'p' FROM generate_series(1, 100) g")
    _drain(spark, source, lake_root)

    def failing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("an executor was lost")

    with monkeypatch.context() as patched:
        patched.setattr(backfill_state, "build_state", failing)
        _drain(spark, source, lake_root, resync=["public.b"])


def test_a_gap_found_while_a_resync_goes_on_begins_it_again(
    spark: Any, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table leaves the publication and comes back while its resync waits to be built:
    what changed meanwhile is in no changelog, so the chunks copied before are not enough.
    Before (a second review found it): the old resync took the new gap over, and the update
    made while the table was out was lost."""
    lake_root = str(tmp_path / "lake")
    _resync_left_unbuilt(spark, source, lake_root, monkeypatch)
    assert record.read(Lake(lake_root, source.slot)).plans["public.b"].why == "resync"
    source.sql(f"ALTER PUBLICATION {source.publication} DROP TABLE b")
    source.sql("UPDATE b SET v = 'while out' WHERE id <= 10")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
    result = _drain(spark, source, lake_root)
    assert result["incomplete"] == {} and result["backfills"] == {"public.b": {"built": True}}
    assert_state_equals_source(source, lake_root, B)


def test_a_column_renamed_while_the_state_is_built_keeps_its_values(
    spark: Any, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename whose window commits while the build runs (on its own thread) belongs after the
    build's position. Before (a review found it): the build read the changelog's newest version,
    took the new name for a new column, and every row the chunks copied lost its value."""
    from airflow_pglogrepl.lake import delta
    from airflow_pglogrepl.merge import materialize

    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    _added_table(source, 30)
    source.sql("UPDATE b SET v = 'u' WHERE id = 2")  # (a changelog for the build to read)
    real_merge = materialize.merge_range
    changes_b = f"{lake_root}/changes/{table_dir(B)}"

    renamed: list[bool] = []

    def merge_after_a_rename(*args: Any, **kwargs: Any) -> str:
        if renamed or not threading.current_thread().name.startswith("backfill"):
            return real_merge(*args, **kwargs)  # (the run's own merges)
        renamed.append(True)
        source.sql("ALTER TABLE b RENAME COLUMN v TO w; UPDATE b SET w = 'renamed' WHERE id = 1")
        deadline = time.monotonic() + 60
        while "w" not in (delta.arrow_schema(changes_b) or []).names:  # its window committed
            assert time.monotonic() < deadline, "the rename's window did not commit"
            time.sleep(0.1)
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(materialize, "merge_range", merge_after_a_rename)
    result = _drain(spark, source, lake_root, backfill_rows=1000)
    assert renamed and result["backfills"] == {"public.b": {"built": True}}
    _drain(spark, source, lake_root)  # the changes since the build merged
    assert_state_equals_source(source, lake_root, B)


def test_a_column_renamed_while_a_chunk_is_copied_keeps_its_values(
    spark: Any, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename whose window commits after the chunk's snapshot was taken (windows go on while
    a chunk is copied): the chunk stores its rows under the lake's names as they were at its
    snapshot. Before (a review found it): the names were read after the rename's window, the
    chunk's ``v`` became a column of its own, and every copied row lost its value."""
    from airflow_pglogrepl.lake import delta
    from airflow_pglogrepl.spark import backfill

    lake_root = str(tmp_path / "lake")
    _first_lake(spark, source, lake_root)
    _added_table(source, 30)
    source.sql("UPDATE b SET v = 'u' WHERE id = 2")  # (a changelog whose names the chunk reads)
    changes_b = f"{lake_root}/changes/{table_dir(B)}"
    check, renamed = backfill.OnlineBackfill._check_unchanged, []

    def then_a_rename_commits(self: Any, plan: Any, chunk: Any) -> Any:
        described = check(self, plan, chunk)
        if not renamed:
            renamed.append(True)
            source.sql("ALTER TABLE b RENAME COLUMN v TO w; UPDATE b SET w = 'r' WHERE id = 1")
            deadline = time.monotonic() + 60
            while "w" not in (delta.arrow_schema(changes_b) or []).names:  # its window committed
                assert time.monotonic() < deadline, "the rename's window did not commit"
                time.sleep(0.1)
        return described

    monkeypatch.setattr(backfill.OnlineBackfill, "_check_unchanged", then_a_rename_commits)
    result = _drain(spark, source, lake_root, backfill_rows=1000)
    assert renamed and result["backfills"] == {"public.b": {"built": True}}
    _drain(spark, source, lake_root)  # the changes since the build merged
    assert_state_equals_source(source, lake_root, B)


def test_a_partition_created_between_a_roots_chunks_lets_the_backfill_go_on(
    spark: Any,
    source: Source,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A partition created (born empty, every row of its life in the WAL) while a root is
    backfilled moves no row between chunks. Before (a review found it): the new heap file began
    the backfill again, and a root whose partitions are made ahead never finished."""
    lake_root = str(tmp_path / "lake")
    root = TableRef("public", "parted")
    _drained_root(spark, source, lake_root)
    source.sql("CREATE TABLE parted_af (id int, region text, v text, PRIMARY KEY (id, region))")
    source.sql("INSERT INTO parted_af SELECT g, 'af', 'x' FROM generate_series(1, 300) g")
    source.sql("ALTER TABLE parted ATTACH PARTITION parted_af FOR VALUES IN ('af')")

    def create_one_after_the_first(copied: int) -> None:
        if copied == 1:
            source.sql("CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')")
            source.sql("INSERT INTO parted SELECT g, 'eu', 'y' FROM generate_series(1, 40) g")

    _around_each_chunk(monkeypatch, after=create_one_after_the_first)
    caplog.set_level("INFO", logger="airflow_pglogrepl.backfill")
    result = _drain(spark, source, lake_root)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "begins again" in m], said
    assert len([m for m in said if m.startswith("public.parted: backfill chunk")]) >= 2, said
    assert result["incomplete"] == {} and result["backfills"] == {"public.parted": {"built": True}}
    assert_state_equals_source(source, lake_root, root)


def test_a_partition_attached_and_detached_while_a_chunk_is_read_leaves_no_row(
    spark: Any, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk reads the leaves its check found, in its snapshot, whatever is attached before
    its readers plan. Before (a review found it): the readers read the root, so a table
    attached after the check and detached before the next one left its rows in the root's
    state, and nothing noticed."""
    from airflow_pglogrepl.spark import backfill

    lake_root = str(tmp_path / "lake")
    root = TableRef("public", "parted")
    _drained_root(spark, source, lake_root)
    source.sql("CREATE TABLE swap (id int, region text, v text, PRIMARY KEY (id, region))")
    source.sql("INSERT INTO swap SELECT g, 'sw', 'swapped' FROM generate_series(1, 30) g")
    check, attached = backfill.OnlineBackfill._check_unchanged, []

    def then_one_is_attached(self: Any, plan: Any, chunk: Any) -> Any:
        described = check(self, plan, chunk)
        if not attached:
            attached.append(True)
            source.sql("ALTER TABLE parted ATTACH PARTITION swap FOR VALUES IN ('sw')")
        return described

    def detached_after(copied: int) -> None:
        if copied == 1:
            source.sql("ALTER TABLE parted DETACH PARTITION swap")

    monkeypatch.setattr(backfill.OnlineBackfill, "_check_unchanged", then_one_is_attached)
    _around_each_chunk(monkeypatch, after=detached_after)
    result = _drain(spark, source, lake_root, resync=["public.parted"])
    assert attached and result["backfills"] == {"public.parted": {"built": True}}
    assert_state_equals_source(source, lake_root, root)


def test_a_partition_born_during_a_roots_backfill_then_dropped_begins_it_again(
    spark: Any,
    source: Source,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A born partition's rows come by the WAL, but its drop sends nothing: once a chunk took
    it on, its files are the plan's, and their going begins the backfill again. Before (a
    review found it): the plan never took them on, and the dropped partition's rows stayed."""
    lake_root = str(tmp_path / "lake")
    root = TableRef("public", "parted")
    _drained_root(spark, source, lake_root, value="repeat('x', 200)")
    source.sql("CREATE TABLE parted_af (id int, region text, v text, PRIMARY KEY (id, region))")
    source.sql("INSERT INTO parted_af SELECT g, 'af', repeat('x', 200)"
               " FROM generate_series(1, 300) g")  # fmt: skip
    source.sql("ALTER TABLE parted ATTACH PARTITION parted_af FOR VALUES IN ('af')")

    def born_then_dropped(copied: int) -> None:
        if copied == 1:
            source.sql("CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')")
            source.sql("INSERT INTO parted SELECT g, 'eu', 'y' FROM generate_series(1, 40) g")
        elif copied == 3:
            source.sql("DROP TABLE parted_eu")

    _around_each_chunk(monkeypatch, after=born_then_dropped)
    caplog.set_level("INFO", logger="airflow_pglogrepl.backfill")
    result = _drain(spark, source, lake_root)
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if "begins again" in m and "dropped" in m], said
    assert result["incomplete"] == {} and result["backfills"] == {"public.parted": {"built": True}}
    assert_state_equals_source(source, lake_root, root)


def test_a_table_created_filled_and_attached_in_one_transaction_is_backfilled(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """Its rows written before the ATTACH are in no change the root's publication sends.
    Before: the link made by the table's creator took it for a born partition, no gap was
    found, and the lake silently lacked its rows."""
    lake_root = str(tmp_path / "lake")
    root = TableRef("public", "parted")
    source.sql("CREATE TABLE parted (id int, region text, v text, PRIMARY KEY (id, region))"
               " PARTITION BY LIST (region)")  # fmt: skip
    source.sql("CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE parted"
               " WITH (publish_via_partition_root = true)")  # fmt: skip
    source.sql("INSERT INTO parted SELECT g, 'us', 'x' FROM generate_series(1, 20) g")
    _drain(spark, source, lake_root)
    source.sql("CREATE TABLE parted_af (id int, region text, v text, PRIMARY KEY (id, region));"
               "INSERT INTO parted_af SELECT g, 'af', 'x' FROM generate_series(1, 30) g;"
               "ALTER TABLE parted ATTACH PARTITION parted_af FOR VALUES IN ('af');"
               "INSERT INTO parted VALUES (31, 'af', 'after')")  # fmt: skip
    result = _drain(spark, source, lake_root)
    assert result["incomplete"] == {} and result["backfills"] == {"public.parted": {"built": True}}
    assert_state_equals_source(source, lake_root, root)


def test_a_promotion_begins_a_backfill_again_for_what_asked_for_it(
    spark: Any,
    source: Source,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A backfill begun on one timeline, found on a later one (a promotion): its chunks were read
    from the old primary, which nothing held back to what the standby had, so it begins again,
    keeping what asked for it (here a resync). Before, the chunks stayed and built the state;
    then the drain dropped them on a promotion, and a resync was lost."""
    from airflow_pglogrepl.spark import backfill

    lake_root = str(tmp_path / "lake")
    _resync_left_unbuilt(spark, source, lake_root, monkeypatch)
    first = record.read(Lake(lake_root, source.slot)).plans["public.b"]
    assert first.why == "resync" and first.timeline == 1
    source.sql("UPDATE b SET v = 'after' WHERE id <= 10")
    monkeypatch.setattr(backfill.OnlineBackfill, "_timeline", lambda self: 2)
    result = _drain(spark, source, lake_root)  # (the resync is not asked again)
    assert result["backfills"] == {"public.b": {"built": True}}, result
    assert "public.b: the backfill begins again: the server was promoted (timeline 1" in caplog.text
    assert_state_equals_source(source, lake_root, B)
