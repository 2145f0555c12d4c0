"""The Delta lake under concurrency and crashes, against a live cluster and real Spark.

Readers polling the tables through ``deltalake`` (no JVM) while drains and merges run only ever
see committed versions; a second writer is refused and loses nothing; a merge killed at any step
is finished by the next run, and the tables end equal to the source.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.lake.delta import open_table, read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.wait import wait_until
from tests.integration.test_drain import Source, drain_app, drain_in_process, source, summary
from tests.support.drain import all_changelog_keys, lake_rows, source_rows

# Merges and readers run Spark, some as applications of their own (a JVM).
pytestmark = pytest.mark.spark

__all__ = ["source"]  # the fixture, shared with the drain tests

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
