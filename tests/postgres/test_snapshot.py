"""The initial snapshot's statements: exported snapshot names checked before they reach SQL,
the range read composed for each kind of table, the published tables as pgoutput sees them at
the snapshot (column lists, row filters combined, the key under FULL) and the refusals, rows
read in ctid ranges through ADBC, and a snapshot gone said so with the fix."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from airflow_pglogrepl.exceptions import SnapshotReadError
from airflow_pglogrepl.postgres.snapshot import (
    ExportedSnapshot,
    SnapshotReader,
    SnapshotTable,
    select_statement,
    select_statements,
    validate_snapshot_name,
)
from airflow_pglogrepl.tables import Column, TableRef
from tests.support.databases import Database

T = TableRef('Sch"; ema', "T a'b")


def _table(relkind: str = "r", row_filter: str | None = None) -> SnapshotTable:
    columns = (Column("id", "integer", is_key=True), Column('v"x', "text"))
    return SnapshotTable(T, 1, relkind, "d", columns, row_filter, 10, 100.0, 10, ("p",), 10)


@pytest.mark.parametrize("name", ["00000003-0000001B-1", "0000000a-00000000000001ab-12"])
def test_exported_snapshot_names_are_taken(name: str) -> None:
    assert validate_snapshot_name(name) == name


@pytest.mark.parametrize("name", ["", "3-1B-1", "00000003-0000001B-1'; DROP TABLE t; --",
                                  "00000003-0000001B-x", " 00000003-0000001B-1"])  # fmt: skip
def test_anything_else_is_refused_before_it_reaches_sql(name: str) -> None:
    with pytest.raises(ValueError, match="is not the name of an exported snapshot"):
        validate_snapshot_name(name)


def test_a_range_read_is_composed_for_each_kind_of_table() -> None:
    text = select_statement(_table(), ["int8", None], 2, 5).as_string(None)
    assert text == (
        'SELECT "id"::"pg_catalog"."int8" AS "id", CASE WHEN pg_catalog.num_nulls("v""x")'
        ' OPERATOR(pg_catalog.=) 0 THEN pg_catalog.format(\'%s\'::pg_catalog.text, "v""x") END'
        ' AS "v""x" FROM ONLY "Sch""; ema"."T a\'b"'
        " WHERE ctid >= '(2,0)'::tid AND ctid < '(5,0)'::tid"
    )
    whole = select_statement(_table(), [None, None]).as_string(None)
    assert "WHERE" not in whole and "FROM ONLY" in whole  # the first range has no lower bound
    partitioned = select_statement(_table("p", "(id > 1)"), [None, None], 2, 5).as_string(None)
    assert partitioned.endswith(  # each leaf's blocks 2 to 4 (ctids are per leaf)
        ' FROM "Sch""; ema"."T a\'b" WHERE ctid >= \'(2,0)\'::tid AND ctid < \'(5,0)\'::tid'
        " AND ((id > 1))"
    )
    leaves = dataclasses.replace(_table("p"), leaves=(TableRef("s", "l1"), TableRef("s", 'l"2')))
    first, second = (q.as_string(None) for q in select_statements(leaves, [None, None], 2, 5))
    assert ' FROM ONLY "s"."l1" WHERE ctid >= \'(2,0)\'' in first
    assert ' FROM ONLY "s"."l""2" WHERE ctid >= \'(2,0)\'' in second
    assert select_statements(dataclasses.replace(leaves, leaves=()), [None, None]) == []
    with pytest.raises(ValueError, match="1 casts for the 2 columns"):
        select_statement(_table(), ["int8"])


@pytest.fixture
def published(database: Database, slot_name: str) -> Iterator[tuple[Database, ExportedSnapshot]]:
    database.sql(
        'CREATE SCHEMA "Sch""; ema";'
        'CREATE TABLE "Sch""; ema"."T a\'b" (id int PRIMARY KEY, "v""x" text, w int);'
        'ALTER TABLE "Sch""; ema"."T a\'b" REPLICA IDENTITY FULL;'
        'INSERT INTO "Sch""; ema"."T a\'b" SELECT g, \'v\' || g, g FROM generate_series(1, 9) g;'
        "CREATE TABLE other (id int PRIMARY KEY, a int, b int);"
        'CREATE PUBLICATION p1 FOR TABLE "Sch""; ema"."T a\'b" WHERE (id > 7);'
        'CREATE PUBLICATION p2 FOR TABLE "Sch""; ema"."T a\'b" WHERE (w < 2);'
        "CREATE PUBLICATION p3 FOR TABLE other (id, a);"
        "CREATE PUBLICATION p4 FOR TABLE other (id, b)"
    )
    with database.hook.create_slot_with_snapshot(slot_name, temporary=True) as exported:
        yield database, exported


def test_published_tables_as_pgoutput_sees_them_and_what_it_refuses(
    published: tuple[Database, ExportedSnapshot],
) -> None:
    database, exported = published
    reader = SnapshotReader(database.hook.connection_params(), label="the test's source")
    with reader.transaction(exported.snapshot_name) as conn:
        (table,) = reader.published_tables(conn, ["p1", "p2"], [T])
        assert [c.name for c in table.columns] == ["id", 'v"x', "w"]
        assert all(c.is_key for c in table.columns)  # FULL: every column is the key
        assert table.row_filter == "((id > 7)) OR ((w < 2))" and table.publications == ("p1", "p2")
        with pytest.raises(ValueError, match="are not published by"):
            reader.published_tables(conn, ["p1"], [TableRef("public", "absent")])
        conn.rollback()
    different = pytest.raises(ValueError, match=r"public\.other is published with different col")
    with reader.transaction(exported.snapshot_name) as conn, different:
        reader.published_tables(conn, ["p3", "p4"])
    database.sql('DELETE FROM "Sch""; ema"."T a\'b" WHERE id = 9')  # after the snapshot
    rows = [
        row
        for batch in reader.arrow_batches(exported.snapshot_name, table, ["int8", None, None])
        for row in batch.to_pylist()
    ]
    assert rows == [{"id": 1, 'v"x': "v1", "w": "1"}, {"id": 8, 'v"x': "v8", "w": "8"},
                    {"id": 9, 'v"x': "v9", "w": "9"}]  # fmt: skip
    empty = reader.arrow_batches(exported.snapshot_name, table, ["int8", None, None],
                                 start_block=1, stop_block=2)  # fmt: skip
    assert sum(batch.num_rows for batch in empty) == 0  # nine short rows fill one block


def test_a_snapshot_gone_is_said_with_the_fix(database: Database, slot_name: str) -> None:
    database.sql("CREATE TABLE t (id int); CREATE PUBLICATION p FOR TABLE t")
    reader = SnapshotReader(database.hook.connection_params())
    exported = database.hook.create_slot_with_snapshot(slot_name, temporary=True)
    with exported, reader.transaction(exported.snapshot_name) as conn:
        (table,) = reader.published_tables(conn, ["p"])
    with pytest.raises(SnapshotReadError, match=r"The exported snapshot no longer exists\. Fix:"):
        list(reader.arrow_batches(exported.snapshot_name, table, [None]))


def test_an_exported_snapshot_kept_waiting_by_an_open_transaction_gives_up_in_time(
    database: Database, slot_name: str
) -> None:
    """Before: creating the slot waited for as long as any transaction that held an id when it
    began stayed open (one session idle in transaction held a drain's repair for ever)."""
    import time

    import psycopg

    from airflow_pglogrepl.exceptions import SnapshotWaitError

    with psycopg.connect(database.cluster.dsn(database.name), autocommit=False) as holder:
        holder.execute("SELECT pg_current_xact_id()")  # an open transaction with an id
        began = time.monotonic()
        with pytest.raises(SnapshotWaitError, match=r"pg_stat_activity"):
            database.hook.create_slot_with_snapshot(slot_name, temporary=True, wait_s=1.0)
        assert time.monotonic() - began < 30
    with database.hook.create_slot_with_snapshot(slot_name, temporary=True, wait_s=30.0) as held:
        assert held.snapshot_name  # once it is gone the slot is made, and the timer is off


def test_a_partitioned_root_is_read_in_ranges_cut_across_its_leaves(
    database: Database, slot_name: str
) -> None:
    """Leaves of different sizes, a sub-partitioned one and a default one: ranges up to the
    biggest leaf's blocks read every row once. Before: a root had no size (0 blocks) and was
    read in one range, whatever it held."""
    from airflow_pglogrepl.spark.range_copy import plan_ranges

    database.sql(
        "CREATE TABLE r (id int, k int, pad text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);"
        "CREATE TABLE r_small PARTITION OF r FOR VALUES FROM (0) TO (1);"
        "CREATE TABLE r_big PARTITION OF r FOR VALUES FROM (1) TO (2);"
        "CREATE TABLE r_sub PARTITION OF r FOR VALUES FROM (2) TO (4) PARTITION BY LIST (k);"
        # Autovacuum would analyze the unmeasured leaves at its own moment (a CI run saw 3800).
        "CREATE TABLE r_sub2 PARTITION OF r_sub FOR VALUES IN (2) WITH (autovacuum_enabled = off);"
        "CREATE TABLE r_sub3 PARTITION OF r_sub FOR VALUES IN (3) WITH (autovacuum_enabled = off);"
        "CREATE TABLE r_rest PARTITION OF r DEFAULT WITH (autovacuum_enabled = off);"
        "INSERT INTO r SELECT g, 0, repeat('s', 100) FROM generate_series(1, 100) g;"
        "INSERT INTO r SELECT g, 1, repeat('b', 100) FROM generate_series(1, 3000) g;"
        "INSERT INTO r SELECT g, 2 + g % 2, repeat('c', 100) FROM generate_series(1, 700) g;"
        "INSERT INTO r SELECT g, 9, repeat('d', 100) FROM generate_series(1, 50) g;"
        "ANALYZE r_small, r_big;"  # the others never measured
        "CREATE PUBLICATION pr FOR TABLE r WITH (publish_via_partition_root = true)"
    )
    reader = SnapshotReader(database.hook.connection_params())
    with database.hook.create_slot_with_snapshot(slot_name, temporary=True) as exported:
        with reader.transaction(exported.snapshot_name) as conn:
            (table,) = reader.published_tables(conn, ["pr"])
        sizes = database.sql(
            "SELECT sum(pg_relation_size(relid)) / 8192 AS blocks,"
            " max(pg_relation_size(relid)) / 8192 AS span"
            " FROM pg_partition_tree('r') WHERE isleaf"
        )[0]
        assert (table.blocks, table.span) == tuple(sizes) and table.span > 10
        assert table.reltuples == 3100.0  # the measured leaves' rows, over their pages
        ranges = plan_ranges(table, max_tasks=5, rows_per_task=500)
        assert len(ranges) == 5 and ranges[-1].stop is None
        read: list[tuple[int, int]] = []
        for block_range in ranges:
            for batch in reader.arrow_batches(exported.snapshot_name, table, ["int8", "int8", None],
                                              start_block=block_range.start,
                                              stop_block=block_range.stop):  # fmt: skip
                read += [(row["id"], row["k"]) for row in batch.to_pylist()]
    assert len(read) == 3850 and len(set(read)) == 3850  # every row, once


def test_a_table_described_alone_locks_no_other_tables_leaves(database: Database) -> None:
    """A backfill chunk describes its table inside its snapshot's transaction, open for the whole
    copy: a size read there locks a partitioned table's leaves until then (a DETACH of another
    root's partition waited for the chunk). Before (a review found it): every published root's
    leaves were locked, whichever table was asked for."""
    database.sql(
        "CREATE TABLE other_root (id int PRIMARY KEY) PARTITION BY RANGE (id);"
        "CREATE TABLE other_leaf PARTITION OF other_root FOR VALUES FROM (0) TO (10);"
        "CREATE TABLE mine (id int PRIMARY KEY);"
        "CREATE PUBLICATION pl FOR TABLE other_root, mine WITH (publish_via_partition_root = true)"
    )
    reader = SnapshotReader(database.hook.connection_params())
    with database.hook.session() as conn:
        conn.autocommit = False
        (table,) = reader.published_tables(conn, ["pl"], [TableRef("public", "mine")])
        locked = conn.execute(
            "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'other%'"
        ).fetchall()
        conn.rollback()
    assert table.table == TableRef("public", "mine") and locked == []
