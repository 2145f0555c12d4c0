"""The positions and snapshots an online backfill copies a table between, read live: the
transactions in progress at its start (the ones whose commit may precede its ``low`` and still
be unseen by a chunk's snapshot), a chunk's exported snapshot, and the heap files whose change
says rows moved between blocks."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.backfill import (
    backfill_start,
    chunk_snapshot,
    heap_change,
    heap_check,
    heap_files,
)
from airflow_pglogrepl.postgres.source import PgSource
from tests.support.databases import Database

pytestmark = pytest.mark.pgversion  # the snapshot and transaction id functions it reads


def params(database: Database) -> dict[str, str]:
    return PgSource(database.cluster.dsn(database.name)).connection_params()


def test_the_start_names_the_transactions_in_progress_as_pgoutput_numbers_them(
    database: Database,
) -> None:
    with psycopg.connect(database.cluster.dsn(database.name)) as other:
        xid = other.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        assert xid is not None
        start = backfill_start(params(database))
        assert xid[0] % (1 << 32) in start.in_progress
        other.rollback()
    after = backfill_start(params(database))
    assert xid[0] % (1 << 32) not in after.in_progress
    assert start.low <= after.low


def test_a_chunk_snapshot_is_exported_and_high_follows_what_it_saw(database: Database) -> None:
    database.sql("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 9)")
    relid = int(database.sql("SELECT 't'::regclass::oid")[0][0])
    src = params(database)
    before = backfill_start(src).low
    with chunk_snapshot(src, relid) as chunk:
        assert chunk.files == heap_files(src, relid) and len(chunk.files) == 1
        database.sql("INSERT INTO t VALUES (10)")  # after the snapshot: not in it
        with psycopg.connect(database.cluster.dsn(database.name)) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute(f"SET TRANSACTION SNAPSHOT '{chunk.name}'")
            count = reader.execute("SELECT count(*) FROM t").fetchone()
        assert count == (9,)
    assert chunk.high is not None and chunk.high > before
    assert isinstance(chunk.high, LSN)
    # the drain can reach it even on an idle source: the statement's commit record is past it,
    # flushed by the WAL writer (asynchronously: before, this read it at once and failed
    # when the WAL writer had not yet run)
    source, deadline = PgSource(database.cluster.dsn(database.name)), time.monotonic() + 5
    while (flushed := source.flush_lsn()) < chunk.high and time.monotonic() < deadline:
        time.sleep(0.02)
    assert flushed >= chunk.high


def test_a_rewrite_or_a_partition_attached_or_detached_moves_rows_a_born_one_does_not(
    database: Database,
) -> None:
    """Before (a review found it): any new leaf began a root's backfill again, so one whose
    partitions are made ahead (pg_partman's premake) between chunks never ended."""
    database.sql("CREATE TABLE r (id int PRIMARY KEY); INSERT INTO r VALUES (1)")
    database.sql("CREATE TABLE p (id int) PARTITION BY RANGE (id)")
    database.sql("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10)")
    src = params(database)
    r, p = (int(database.sql(f"SELECT '{n}'::regclass::oid")[0][0]) for n in ("r", "p"))
    files_r, files_p = heap_files(src, r), heap_files(src, p)
    assert heap_change(src, r, files_r) is None and heap_change(src, p, files_p) is None
    database.sql("VACUUM FULL r")
    assert "rewritten" in (heap_change(src, r, files_r) or "")
    # born partitions, one under a partitioned one born too: no row of theirs left out of the WAL
    database.sql("CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (10) TO (20)")
    database.sql("CREATE TABLE p3 PARTITION OF p FOR VALUES FROM (20) TO (30)"
                 " PARTITION BY RANGE (id)")  # fmt: skip
    database.sql("CREATE TABLE p31 PARTITION OF p3 FOR VALUES FROM (20) TO (25)")
    assert len(heap_files(src, p)) == len(files_p) + 2
    assert heap_change(src, p, files_p) is None
    # a table attached with rows; and a born leaf under a partitioned table attached
    database.sql("CREATE TABLE p4 (id int); INSERT INTO p4 VALUES (31)")
    database.sql("ALTER TABLE p ATTACH PARTITION p4 FOR VALUES FROM (30) TO (40)")
    assert "attached" in (heap_change(src, p, files_p) or "")
    database.sql("ALTER TABLE p DETACH PARTITION p4; DROP TABLE p4")
    database.sql("CREATE TABLE p5 (id int) PARTITION BY RANGE (id)")
    database.sql("CREATE TABLE p51 PARTITION OF p5 FOR VALUES FROM (40) TO (45)")
    database.sql("INSERT INTO p5 VALUES (41)")
    database.sql("ALTER TABLE p ATTACH PARTITION p5 FOR VALUES FROM (40) TO (50)")
    assert "attached" in (heap_change(src, p, files_p) or "")
    database.sql("ALTER TABLE p DETACH PARTITION p5")
    assert heap_change(src, p, files_p) is None  # (back to born ones only)
    database.sql("ALTER TABLE p DETACH PARTITION p1")
    assert "detached" in (heap_change(src, p, files_p) or "")


def test_a_link_the_chunks_snapshot_does_not_show_is_no_born_partition(
    database: Database,
) -> None:
    """A table attached (holding rows) after a chunk's snapshot was taken: its link row is not
    in the snapshot. Before (a review found it): a link it could not see counted as made by
    the table's creator, so the table passed for born, and its rows for the WAL's."""
    database.sql("CREATE TABLE p (id int) PARTITION BY RANGE (id)")
    database.sql("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10)")
    database.sql("CREATE TABLE late (id int); INSERT INTO late VALUES (15)")
    src = params(database)
    p = int(database.sql("SELECT 'p'::regclass::oid")[0][0])
    planned = heap_files(src, p)
    with psycopg.connect(database.cluster.dsn(database.name), row_factory=dict_row) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")  # the snapshot is taken
        database.sql("ALTER TABLE p ATTACH PARTITION late FOR VALUES FROM (10) TO (20)")
        seen = heap_check(conn, p, planned)
        conn.rollback()
    assert "attached" in (seen.moved or "") and len(seen.leaves) == 2


def test_a_chunk_waits_seconds_at_most_for_a_lock_another_statement_holds(
    database: Database,
) -> None:
    """Describing the table in the chunk's snapshot reads the size of every published table:
    one locked by a VACUUM FULL or an ALTER must not hold the drain (a chunk is copied after
    a window, in the drain's thread). Before (a review found it): it waited for as long as the
    lock was held."""

    database.sql("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int)")
    relid = int(database.sql("SELECT 't'::regclass::oid")[0][0])
    with psycopg.connect(database.cluster.dsn(database.name)) as locker:
        locker.execute("LOCK TABLE other IN ACCESS EXCLUSIVE MODE")
        began = time.monotonic()
        with (
            chunk_snapshot(params(database), relid) as chunk,
            pytest.raises(psycopg.errors.LockNotAvailable),
        ):
            chunk.conn.execute("SELECT pg_relation_size('other')")
        assert time.monotonic() - began < 30
