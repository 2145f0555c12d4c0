"""Schema changes mid-stream, against a live cluster and real Spark: the lake follows the source
by itself, and what it cannot follow stops the drain before anything is committed, naming the
re-snapshot that then recovers it.

Each test ends with ``state/`` equal to the source, value by value, over the source's columns
(a dropped column stays in the lake, NULL for rows written after the drop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import ONE_WINDOW, assert_state_equals_source, drain_in_process, read_delta
from tests.support.snapshot import re_snapshot
from tests.support.sources import Source

T, V = TableRef("public", "t"), TableRef("public", "v")
SMALL_WINDOWS = 2048


def in_one_transaction(src: Source, *statements: str) -> None:
    with src.cluster.connect(src.db) as conn:
        for statement in statements:
            conn.execute(statement)


def test_columns_added_dropped_and_widened_mid_stream_follow_the_source(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE t (id int PRIMARY KEY, a text, n int, gone text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t SELECT g, md5(g::text), g, 'old' FROM generate_series(1, 300) g")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_state_equals_source(source, lake_root, T)

    # Between windows, each DDL followed by changes; all of it drained in small windows.
    source.sql("ALTER TABLE t ADD COLUMN d int DEFAULT 7")  # existing rows read 7, no change sent
    source.sql("UPDATE t SET a = 'touched' WHERE id % 10 = 0")
    source.sql("ALTER TABLE t ADD COLUMN e text")  # no default: existing rows read NULL
    source.sql("UPDATE t SET e = 'set' WHERE id <= 5")
    drain_in_process(spark, source, lake_root, window=SMALL_WINDOWS)
    assert_state_equals_source(source, lake_root, T)
    # (A rewrite such as this one makes PostgreSQL forget how the rows above got d's value:
    # drained before it, the lake knew already.)
    source.sql("ALTER TABLE t ALTER COLUMN n TYPE bigint")  # rewrites the table, sends no change
    source.sql("UPDATE t SET n = 3000000000 + id WHERE id % 3 = 0")  # past 2^31
    source.sql("INSERT INTO t (id, a, n) VALUES (1000, 'new', 4000000000)")
    drain_in_process(spark, source, lake_root, window=SMALL_WINDOWS)
    assert_state_equals_source(source, lake_root, T)

    # Inside one window: a column added between two changes of one transaction, a numeric
    # default, a drop, and changes on both sides of each.
    source.sql("ALTER TABLE t ALTER COLUMN a TYPE varchar(100)")
    in_one_transaction(
        source,
        "INSERT INTO t (id, a) VALUES (2000, 'before f')",
        "ALTER TABLE t ADD COLUMN f numeric(10,2) DEFAULT 1.50",
        "INSERT INTO t (id, a) VALUES (2001, 'after f')",
    )
    source.sql("UPDATE t SET f = 2.25 WHERE id % 4 = 0")
    source.sql("ALTER TABLE t DROP COLUMN gone")
    source.sql("UPDATE t SET a = 'after drop' WHERE id % 7 = 0")
    source.sql("DELETE FROM t WHERE id % 11 = 0")
    source.sql("ALTER TABLE t ALTER COLUMN f TYPE numeric(20,2)")  # precision up: no rewrite
    source.sql("ALTER TABLE t ADD COLUMN g text DEFAULT 'it''s, \"g\"'")
    source.sql("INSERT INTO t (id, a, g) VALUES (3000, 'last', 'own')")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_state_equals_source(source, lake_root, T)

    # The dropped column stays: old values where rows were not written since, NULL where they were.
    state = {
        r["id"]: r["gone"] for r in read_delta(Path(lake_root, "state", "public.t")).to_pylist()
    }
    assert state[1] == "old" and state[7] is None and state[3000] is None


def test_what_the_lake_cannot_follow_stops_the_drain_and_a_re_snapshot_recovers(
    spark: Any, source: Source, tmp_path: Path
) -> None:

    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE t (id int PRIMARY KEY, n int)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 200) g")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    lake = Lake(lake_root, source.slot)
    hook = source.hook()

    # A type the lake stores differently: the table goes to the quarantine, its changes kept
    # there (tests/spark/test_quarantine.py), the slot moves on; a re-snapshot recovers.
    source.sql("UPDATE t SET n = -n WHERE id <= 3")
    source.sql("ALTER TABLE t ALTER COLUMN n TYPE text USING 'n=' || n")
    source.sql("UPDATE t SET n = 'after' WHERE id <= 2")
    held = drain_in_process(spark, source, lake_root, window=ONE_WINDOW)["quarantined"]["public.t"]
    assert held["error"] == "IncompatibleSchemaChangeError"
    assert held["what"].startswith("column 'n' changed type from int64 to string")
    assert hook.get_slot(source.slot).confirmed_flush_lsn == lake.position()
    re_snapshot(spark, source, lake_root, [T])
    source.sql("UPDATE t SET n = 'later' WHERE id = 10")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_state_equals_source(source, lake_root, T)

    # A volatile default: the rows' values were never sent, so the table is held, then
    # recovers.
    source.sql("ALTER TABLE t ADD COLUMN r float8 DEFAULT random()")
    source.sql("UPDATE t SET n = 'r' WHERE id = 11")
    held = drain_in_process(spark, source, lake_root, window=ONE_WINDOW)["quarantined"]["public.t"]
    assert held["error"] == "ColumnBackfillError" and "column 'r'" in held["what"]
    re_snapshot(spark, source, lake_root, [T])
    source.sql("UPDATE t SET r = 0.5 WHERE id = 12")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_state_equals_source(source, lake_root, T)

    # A rename looks like a drop and an add in pgoutput; the attribute number tells them apart,
    # and the lake renames the column: no re-snapshot.
    source.sql("ALTER TABLE t RENAME COLUMN r TO ratio")
    source.sql("UPDATE t SET ratio = 0.25 WHERE id = 13")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_state_equals_source(source, lake_root, T)


def test_a_table_added_to_the_publication_gets_its_rows_from_a_one_table_snapshot(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE t (id int PRIMARY KEY, n int)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 50) g")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    source.sql("CREATE TABLE v (id int PRIMARY KEY, s text)")
    source.sql("INSERT INTO v SELECT g, 'before' FROM generate_series(1, 100) g")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE v")
    source.sql("UPDATE v SET s = 'changed' WHERE id <= 10")
    source.sql("INSERT INTO v VALUES (500, 'new')")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    # The changelog has what changed since v joined; its older rows come from a snapshot.
    assert len(read_delta(Path(lake_root, "changes", "public.v"))) == 11
    re_snapshot(spark, source, lake_root, [V])
    source.sql("DELETE FROM v WHERE id = 1")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_state_equals_source(source, lake_root, V)
    assert_state_equals_source(source, lake_root, T)
