"""The drain against a live cluster and real Spark: correctness, exactly once under crashes."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import SlotAheadOfSinkError
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.materialize import materialize
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.drain import Drain
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.drain import (
    TYPED_TABLE,
    all_changelog_keys,
    changelog,
    insert_sql,
    lake_rows,
    random_row,
    source_rows,
)

# Drains run in this process's Spark session or as an application of their own (a JVM).
pytestmark = pytest.mark.spark

_ids = itertools.count(1)


@dataclass
class Source:
    cluster: PgCluster
    db: str
    slot: str
    publication: str

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.db)

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.cluster.execute(statement, params, dbname=self.db)

    def hook(self) -> DsnReplicationHook:
        return DsnReplicationHook(self.dsn)


@pytest.fixture
def source(publisher: PgCluster) -> Iterator[Source]:
    """A database of its own with a pgoutput slot created before any table."""
    n = next(_ids)
    db = f"drain_{n}"
    publisher.create_database(db)
    src = Source(publisher, db, f"lake_{n}", "lake_pub")
    src.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (src.slot,))
    yield src
    src.sql("SELECT pg_drop_replication_slot(%s)", (src.slot,))


def drain_in_process(
    spark: Any,
    src: Source,
    sink: str,
    *,
    window: int,
    batch_rows: int = 200_000,
    columnar: bool = True,
) -> dict[str, Any]:
    """One drain run on the session's Spark (no JVM start), then materialize, under the lock."""
    hook = src.hook()
    lake = Lake(sink, src.slot, origins=hook.column_origins)
    with hook.writer_lock(src.slot):
        result = Drain(
            source=hook, lake=lake, slot=src.slot, publications=[src.publication],
            max_window_bytes=window, batch_rows=batch_rows, columnar=columnar,
        ).run(time.monotonic()).to_dict()  # fmt: skip
        result["materialized"] = materialize(spark, lake)
    return result


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["_commit_lsn"], r["_seq"]))


def drain_app(src: Source, sink: str, *args: str, fault: str | None = None) -> Any:
    """The application as a real process (its own JVM), as spark-submit would run it."""
    env = {**os.environ, "PGLOGREPL_SOURCE_DSN": src.dsn}
    env.pop("PGLOGREPL_FAULT", None)
    if fault:
        env["PGLOGREPL_FAULT"] = fault
    command = [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", src.slot,
               "--publication", src.publication, "--sink", sink, *args]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def summary(result: Any) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


TABLES = [TableRef("public", name) for name in ("typed_a", "typed_b", "plain_c", "full_d")]


def workload(src: Source, seed: int) -> int:
    """Random DML on published tables (and noise elsewhere); returns the row changes made."""
    rng = random.Random(seed)
    for name in ("typed_a", "typed_b"):
        src.sql(TYPED_TABLE.format(name=name))
    src.sql("CREATE TABLE plain_c (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE full_d (a int, b text)")  # no key at all
    src.sql("ALTER TABLE full_d REPLICA IDENTITY FULL")
    src.sql("CREATE TABLE noise (x int)")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE typed_a, typed_b, plain_c, full_d")
    changes = 0
    with src.cluster.connect(src.db) as conn:

        def run(statement: str, params: Any = None) -> None:
            nonlocal changes
            changes += conn.execute(statement, params).rowcount

        keys = {"typed_a": list(range(1, 121)), "typed_b": list(range(1, 61))}
        with conn.transaction():
            for table, ids in keys.items():
                for key in ids:
                    run(insert_sql(table), random_row(rng, key, big=key % 10 == 0))
        run("INSERT INTO plain_c SELECT g, 'c' || g FROM generate_series(1, 200) g")
        run("INSERT INTO full_d VALUES (1, 'dup'), (1, 'dup'), (2, 'x'), (3, NULL)")
        run("INSERT INTO noise SELECT generate_series(1, 500)")
        changes -= 500  # noise is not published
        for step in range(40):
            table = rng.choice(["typed_a", "typed_b"])
            with conn.transaction():
                kind = rng.random()
                if kind < 0.35:  # update non-TOAST columns: big stays unchanged (u in pgoutput)
                    run(f"UPDATE {table} SET i = %s, t = NULL WHERE id %% 7 = %s",
                        (rng.randrange(1000), step % 7))  # fmt: skip
                elif kind < 0.5:  # key-changing update
                    run(f"UPDATE {table} SET id = id + 100000 WHERE id = %s",
                        (rng.choice(keys[table]),))  # fmt: skip
                elif kind < 0.65:
                    run(f"DELETE FROM {table} WHERE id = %s", (rng.choice(keys[table]),))
                elif kind < 0.85:
                    key = 1000 + step
                    run(insert_sql(table), random_row(rng, key, big=step % 3 == 0))
                else:
                    run(f"UPDATE {table} SET n = n + 1, big = big WHERE id %% 11 = %s",
                        (step % 11,))  # fmt: skip
        run("UPDATE full_d SET b = 'one' WHERE ctid = (SELECT min(ctid) FROM full_d WHERE a = 1)")
        run("DELETE FROM full_d WHERE a = 3")
        with conn.transaction():
            run("DELETE FROM plain_c WHERE id > 150")
            conn.execute("TRUNCATE plain_c")
            changes += 1  # one T row for plain_c
            run(
                "INSERT INTO plain_c SELECT g, 'after truncate ' || g FROM generate_series(1, 30) g"
            )
        run("UPDATE plain_c SET id = -id WHERE id <= 5")
    return changes


def test_random_dml_in_many_windows_lands_exactly(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    # a second slot, drained by the reference path (psycopg, per-message decoder) alone
    reference = Source(source.cluster, source.db, f"{source.slot}_ref", source.publication)
    source.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (reference.slot,))
    expected_changes = workload(source, seed=20261122)
    sink = str(tmp_path / "lake")
    result = drain_in_process(spark, source, sink, window=12 * 1024)
    assert result["windows"] > 10, result
    assert result["changes"] == expected_changes
    assert result["columnar_windows"] > result["windows"] // 2, result
    # state/ equals every source table, row for row
    for ref in TABLES:
        assert lake_rows(sink, ref) == source_rows(source.cluster, source.db, ref.name), ref
    # the changelog holds every change once: (_commit_lsn, _seq) unique, counts add up
    keys = all_changelog_keys(sink, TABLES)
    assert len(keys) == expected_changes == len(set(keys))
    assert not (Path(sink) / "changes" / "public.noise").exists()
    # TOAST: an unchanged big value is flagged, not written as NULL
    rows = changelog(sink, TableRef("public", "typed_a"))
    assert any(r["_op"] == "U" and r["_unchanged"] == ["big"] for r in rows)
    # the slot sits exactly at the sink's last commit
    slot = source.hook().get_slot(source.slot)
    assert slot.confirmed_flush_lsn == LSN(result["confirmed_flush_lsn_after"])
    # a second run with nothing new drains zero changes and succeeds
    again = drain_in_process(spark, source, sink, window=64 * 1024)
    assert again["changes"] == 0
    # the reference path writes the same changelog, row for row
    ref_sink = str(tmp_path / "reference")
    try:
        done = drain_in_process(spark, reference, ref_sink, window=12 * 1024, columnar=False)
        assert done["columnar_windows"] == 0 and done["changes"] == expected_changes
        for ref in TABLES:
            assert ordered(changelog(ref_sink, ref)) == ordered(changelog(sink, ref)), ref
    finally:
        source.sql("SELECT pg_drop_replication_slot(%s)", (reference.slot,))


@pytest.mark.pgversion
def test_hostile_names_go_through_the_columnar_path(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """Quotes, a semicolon, a backslash and unicode in the publication, schema, table and
    column names: the peek's arguments are bound, the lake's directories escaped. Column names
    Delta Lake refuses are refused before anything is committed, naming the fix."""
    from airflow_pglogrepl.exceptions import UnsupportedColumnNameError

    hostile = Source(source.cluster, source.db, source.slot, 'pub "q"; \\ é')
    table = '"Sch; ema"."Tab ""le"" é"'
    source.sql('CREATE SCHEMA "Sch; ema"')
    source.sql(f'CREATE TABLE {table} (id int PRIMARY KEY, "co""l\\é" text)')
    source.sql(f'CREATE PUBLICATION "pub ""q""; \\ é" FOR TABLE {table}')
    source.sql(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b;''c')")
    source.sql(f'UPDATE {table} SET "co""l\\é" = \'d\' WHERE id = 1')
    sink = str(tmp_path / "lake")
    result = drain_in_process(spark, hostile, sink, window=1 << 30)
    assert result["columnar_windows"] == result["windows"] == 1, result
    ref = TableRef("Sch; ema", 'Tab "le" é')
    assert lake_rows(sink, ref) == [(1, "d"), (2, "b;'c")]

    position = Lake(sink, source.slot).position()
    source.sql(f'ALTER TABLE {table} ADD COLUMN "first name" text')
    source.sql(f"INSERT INTO {table} VALUES (3, 'e', 'f')")
    with pytest.raises(UnsupportedColumnNameError, match=r"\['first name'\].*RENAME COLUMN"):
        drain_in_process(spark, hostile, sink, window=1 << 30)
    assert Lake(sink, source.slot).position() == position


def test_idle_publication_still_advances_the_slot(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    source.sql("CREATE TABLE published (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE published")
    source.sql("CREATE TABLE busy (x text)")
    before = source.hook().get_slot(source.slot).confirmed_flush_lsn
    source.sql("INSERT INTO busy SELECT repeat('w', 200) FROM generate_series(1, 5000)")
    result = drain_in_process(spark, source, str(tmp_path / "lake"), window=256 * 1024)
    assert result["changes"] == 0 and result["windows"] >= 2
    after = source.hook().get_slot(source.slot).confirmed_flush_lsn
    assert before is not None and after is not None and after - before > 1_000_000


def test_slot_ahead_of_sink_fails_loudly(spark: Any, source: Source, tmp_path: Path) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t VALUES (1)")
    sink = str(tmp_path / "lake")
    drain_in_process(spark, source, sink, window=1 << 20)
    source.sql("INSERT INTO t VALUES (2)")
    hook = source.hook()
    hook.advance_slot(source.slot, hook.flush_lsn())  # someone else consumed the change
    with pytest.raises(SlotAheadOfSinkError) as info:
        drain_in_process(spark, source, sink, window=1 << 20)
    text = str(info.value)
    slot_lsn = hook.get_slot(source.slot).confirmed_flush_lsn
    assert str(slot_lsn) in text and "ahead of the sink" in text


@pytest.mark.parametrize("fault", ["mid_write:2", "after_write", "after_commit"])
def test_crash_then_rerun_is_exactly_once(
    spark: Any, source: Source, tmp_path: Path, fault: str
) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    for chunk in range(3):
        source.sql(
            "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g",
            (chunk * 1000 + 1, chunk * 1000 + 1000),
        )
    source.sql("UPDATE t SET v = 'changed' WHERE id % 10 = 0")
    sink = str(tmp_path / "lake")
    # The application dies abruptly (its own process, no clean-up) at the fault point; the
    # re-run recovers the sink and the slot. Both runs skip the merge (no JVM in the process:
    # a local sink needs none to drain); the shared session materializes afterwards.
    args = ("--max-window-bytes", "100000", "--batch-rows", "400", "--no-materialize")
    crashed = drain_app(source, sink, *args, fault=fault)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    lake = Lake(sink, source.slot)
    if fault == "after_commit":  # the window is committed but the slot never moved
        position = lake.position()
        assert position is not None
        assert source.hook().get_slot(source.slot).confirmed_flush_lsn < position
    done = summary(drain_app(source, sink, *args))
    assert done["spark_start_s"] is None  # the drain itself never started Spark
    materialize(spark, lake)
    ref = TableRef("public", "t")
    keys = all_changelog_keys(sink, [ref])
    assert len(keys) == len(set(keys)) == 3300
    assert lake_rows(sink, ref) == source_rows(source.cluster, source.db, "t")
    assert done["lag_bytes_left"] < 100_000
    assert lake.position() == source.hook().get_slot(source.slot).confirmed_flush_lsn


@pytest.mark.pgversion
def test_transaction_larger_than_window_drains_whole_in_flat_memory(
    source: Source, tmp_path: Path
) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    args = ("--max-window-bytes", str(1 << 20), "--batch-rows", "5000", "--no-materialize")
    fill = "INSERT INTO t SELECT g, repeat(md5(g::text), 10) FROM generate_series(%s::int, %s) g"
    sink = str(tmp_path / "lake")
    source.sql(fill, (1, 20_000))  # one transaction of 20,000 rows, about 7 MB of WAL
    small = summary(drain_app(source, sink, *args))
    source.sql(fill, (20_001, 220_000))  # one of 200,000 rows, about 70 MB: 70 windows' worth
    big = summary(drain_app(source, sink, *args))
    assert (small["changes"], big["changes"]) == (20_000, 200_000)
    commits = [w for w in Lake(sink, source.slot).windows() if w["changes"]]
    assert [(w["transactions"], w["changes"]) for w in commits] == [(1, 20_000), (1, 200_000)]
    rows = changelog(sink, TableRef("public", "t"))
    assert len({r["_commit_lsn"] for r in rows if r["id"] > 20_000}) == 1
    # Held whole, the 200,000 decoded rows alone would take well over 100 MB in the driver.
    assert big["peak_rss_mb"] < small["peak_rss_mb"] + 40, (small, big)
    # Empty windows grow geometrically, so the big transaction is reached in a few windows.
    assert big["windows"] < 12, big


def test_refuses_before_spark_starts(
    source: Source, tmp_path: Path, pg_tool: Callable[[str], Path]
) -> None:
    sink = str(tmp_path / "lake")
    missing = Source(source.cluster, source.db, "no_such_slot", "p")
    result = drain_app(missing, sink)
    assert result.returncode == 1 and "'no_such_slot' does not exist" in result.stderr
    source.sql("SELECT pg_create_logical_replication_slot('td_slot', 'test_decoding')")
    try:
        wrong = drain_app(Source(source.cluster, source.db, "td_slot", "p"), sink)
        assert wrong.returncode == 1 and "uses output plugin 'test_decoding'" in wrong.stderr
    finally:
        source.sql("SELECT pg_drop_replication_slot('td_slot')")
    consumer = subprocess.Popen(
        [str(pg_tool("pg_recvlogical")), "-d", source.dsn, "--slot", source.slot, "--start",
         "--no-loop", "-o", "proto_version=1", "-o", "publication_names=p", "-f", os.devnull],
    )  # fmt: skip
    try:
        from airflow_pglogrepl.testing.wait import wait_until

        wait_until(lambda: source.hook().get_slot(source.slot).active, what="consumer attached")
        busy = drain_app(source, sink)
        assert busy.returncode == 1 and "is active in backend PID" in busy.stderr
        assert "JVM" not in busy.stderr and "SparkContext" not in busy.stderr
    finally:
        consumer.terminate()
        consumer.wait(timeout=30)
        wait_until(lambda: not source.hook().get_slot(source.slot).active, what="released")
    assert not Path(sink).exists()
