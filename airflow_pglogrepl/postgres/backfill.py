"""The source side of an online backfill: the positions and snapshots a table is copied
between while the slot keeps being drained, with no lock beyond the one a ``SELECT`` takes.

Why these three reads make a chunked copy exact (``spark.backfill`` builds the state from
them, ``docs/drain.md`` says it in prose):

* ``backfill_start`` reads the WAL insert position ``low``, then, in a later statement, the
  transactions in progress (``in_progress``, 32-bit as pgoutput sends them: those its
  snapshot lists, and those numbered from its ``xmax`` on, which it does not). A transaction
  whose commit record is before ``low`` but which a later snapshot still sees as running
  (its backend had not yet left the process array: a synchronous standby's wait is one way)
  was running at that statement too, so it is among ``in_progress``; every other commit
  before ``low`` is seen by every snapshot taken after it.
* ``chunk_snapshot`` opens a ``REPEATABLE READ`` transaction, exports its snapshot for the
  readers, and says what the table's heap is now (its files: a rewrite gives new ones).
  When it ends it reads ``high``: every commit the snapshot saw is before it, and the WAL is
  flushed past it (the drain reads only flushed WAL, and the lake must reach ``high``).
* So the lake's state at a position ``E >= high`` of every chunk is: the chunks' rows, with
  every change of the changelog from ``low`` on applied over them (from the first commit of
  ``in_progress`` when that is earlier). A row no change touched since ``low`` sat in one
  heap block (of one leaf, for a partitioned table) the whole time and is in exactly one
  chunk; a row a change touched is whatever its last change made it, whatever the chunks
  read. Its heap files unchanged (``heap_check``, but for leaves born since) say no row moved.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.connect import Conn, connect, long_work_settings, set_session
from airflow_pglogrepl.postgres.snapshot import READER_SETTINGS
from airflow_pglogrepl.tables import TableRef

__all__ = [
    "BackfillStart",
    "ChunkSnapshot",
    "HeapCheck",
    "backfill_start",
    "chunk_snapshot",
    "heap_change",
    "heap_check",
    "heap_files",
]

log = logging.getLogger("airflow_pglogrepl.backfill")

_INSERT_LSN = sql.SQL("SELECT pg_catalog.pg_current_wal_insert_lsn() AS lsn")
# The same, from a statement that commits a transaction id of its own: its commit record lies
# past the position read, so the source's WAL is flushed past it even when the source is idle.
# Not at once: a transaction that wrote no WAL before its commit record commits asynchronously
# whatever ``synchronous_commit`` says, and the WAL writer flushes it within three
# ``wal_writer_delay`` (``pipeline.repair`` waits for that).
_FLUSHED_PAST = sql.SQL(
    "SELECT pg_catalog.pg_current_wal_insert_lsn() AS lsn, pg_catalog.pg_current_xact_id()"
)
# The transactions in progress at the statement's snapshot: those it lists (below its xmax),
# and every one from its xmax to the id this statement is given after the snapshot was taken
# (none of those had completed: xmax is one past the newest that had). 32-bit, as pgoutput
# numbers them. The id given costs this statement a commit record, and needs a primary.
_IN_PROGRESS = sql.SQL(
    "WITH s AS (SELECT pg_catalog.pg_current_snapshot() AS snap,"
    " pg_catalog.pg_current_xact_id() AS mine)"
    " SELECT COALESCE(array_agg(DISTINCT pg_catalog.mod(x, 4294967296)::bigint), '{}') AS xids"
    " FROM (SELECT x::text::numeric AS x FROM s, pg_catalog.pg_snapshot_xip(s.snap) AS x"
    " UNION ALL SELECT g FROM s, pg_catalog.generate_series("
    "pg_catalog.pg_snapshot_xmax(s.snap)::text::numeric, s.mine::text::numeric - 1) AS g) AS t"
)
# The heap files of a table, or of each leaf of a partitioned one, each with its relation,
# named: a rewrite (VACUUM FULL, CLUSTER, a column type changed, TRUNCATE) gives new ones, and
# moves rows between blocks.
_HEAP_LEAVES = sql.SQL(
    "SELECT u.relid::pg_catalog.int8 AS relid, n.nspname::pg_catalog.text AS schema_name,"
    " c.relname::pg_catalog.text AS table_name,"
    " pg_catalog.pg_relation_filenode(u.relid)::pg_catalog.int8 AS node FROM ("
    "SELECT t.relid FROM pg_catalog.pg_partition_tree(%(relid)s::pg_catalog.oid"
    "::pg_catalog.regclass) AS t WHERE t.isleaf"
    " UNION SELECT %(relid)s::pg_catalog.oid::pg_catalog.regclass) AS u"
    " JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) u.relid"
    " JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
    " WHERE pg_catalog.pg_relation_filenode(u.relid) IS NOT NULL ORDER BY u.relid"
)
# Of ``relids`` (leaves under ``root``), those born partitions: each link on the way up to the
# root made by the transaction that created its child (``postgres.coverage`` says why that
# means every row they ever held is in the WAL), and seen so: a link the statement's snapshot
# does not show (attached after it was taken) is not. A leaf attached, or one under a
# partitioned table attached, is not born.
_BORN = sql.SQL(
    "SELECT COALESCE(array_agg(l.relid::pg_catalog.int8), '{}') AS born"
    " FROM pg_catalog.unnest(%(relids)s::pg_catalog.oid[]) AS l(relid)"
    " WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_partition_ancestors(l.relid) AS up(relid)"
    " WHERE up.relid OPERATOR(pg_catalog.<>) %(root)s::pg_catalog.oid"
    " AND up.relid IN (SELECT t.relid FROM pg_catalog.pg_partition_tree("
    "%(root)s::pg_catalog.oid::pg_catalog.regclass) AS t)"
    " AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i"
    " JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) i.inhrelid"
    " AND a.attnum OPERATOR(pg_catalog.=) -1"
    " WHERE i.inhrelid OPERATOR(pg_catalog.=) up.relid AND i.xmin OPERATOR(pg_catalog.=) a.xmin))"
)
_EXPORT = sql.SQL("SELECT pg_catalog.pg_export_snapshot() AS name")


@dataclass(frozen=True)
class BackfillStart:
    """Where a backfill's changes begin (``low``), and the transactions running then."""

    low: LSN
    in_progress: tuple[int, ...]


@dataclass
class ChunkSnapshot:
    """One chunk's exported snapshot (``name``), open on ``conn`` until the block ends, and
    the table's heap files in it; ``high`` is read once it has ended."""

    conn: Conn
    name: str
    files: tuple[int, ...]
    high: LSN | None = field(default=None)


def backfill_start(params: dict[str, str], *, label: str = SOURCE_DSN_ENV) -> BackfillStart:
    """``low``, then the transactions in progress, in that order and in two statements (each
    with a snapshot of its own, the second taken after ``low`` was read)."""
    with connect(params, label=f"{label}, a backfill's start") as conn:
        low = _one(conn, _INSERT_LSN)["lsn"]
        xids = _one(conn, _IN_PROGRESS)["xids"]
    return BackfillStart(low=LSN(low), in_progress=tuple(int(x) for x in xids))


def heap_files(
    params: dict[str, str], relid: int, *, label: str = SOURCE_DSN_ENV
) -> tuple[int, ...]:
    """The heap files of table ``relid`` (of each leaf, for a partitioned one), now."""
    with connect(params, label=label) as conn:
        return _files(conn, relid)


@dataclass(frozen=True)
class HeapCheck:
    """A table's heap files now against those planned: ``moved`` says why rows may have moved
    between blocks (None: none did); ``files`` are the files now, ``leaves`` its leaves with a
    heap, named (a partitioned table's; empty for a table)."""

    moved: str | None
    files: tuple[int, ...]
    leaves: tuple[TableRef, ...]


def heap_check(conn: Conn, relid: int, planned: tuple[int, ...]) -> HeapCheck:
    """Whether the rows of table ``relid`` may have moved between heap blocks since its heap
    files were ``planned``: not when the files are the same, or when the only new ones are of
    leaves born partitions since (created ``PARTITION OF``, empty: every row they hold is in
    the WAL after the backfill's ``low``). A rewrite, a leaf attached, detached or dropped
    (a born one too, once its files were planned) says why."""
    rows = conn.execute(_HEAP_LEAVES, {"relid": relid}).fetchall()
    now = {int(r["node"]): int(r["relid"]) for r in rows}
    files = tuple(node for node, _ in sorted(now.items(), key=lambda item: item[1]))
    leaves = tuple(TableRef(r["schema_name"], r["table_name"]) for r in rows
                   if r["relid"] != relid)  # fmt: skip
    if any(node not in now for node in planned):
        return HeapCheck("its heap was rewritten (VACUUM FULL, CLUSTER, TRUNCATE, a type "
                         "change), or a partition detached or dropped", files, leaves)  # fmt: skip
    added = sorted({r for node, r in now.items() if node not in planned})
    if added:
        born = set(_one(conn, _BORN, {"relids": added, "root": relid})["born"])
        attached = [r for r in added if r not in born]
        if attached:
            return HeapCheck(f"a partition was attached (relation {attached[0]}), or rewritten",
                             files, leaves)  # fmt: skip
    return HeapCheck(None, files, leaves)


def heap_change(params: dict[str, str], relid: int, planned: tuple[int, ...], *,
                label: str = SOURCE_DSN_ENV) -> str | None:  # fmt: skip
    """Why rows of ``relid`` may have moved since ``planned`` (``heap_check``), now."""
    with connect(params, label=label) as conn:
        return heap_check(conn, relid, planned).moved


def _files(conn: Conn, relid: int) -> tuple[int, ...]:
    return tuple(int(r["node"]) for r in conn.execute(_HEAP_LEAVES, {"relid": relid}))


@contextmanager
def chunk_snapshot(
    params: dict[str, str], relid: int, *, label: str = SOURCE_DSN_ENV
) -> Iterator[ChunkSnapshot]:
    """A read-only ``REPEATABLE READ`` transaction whose snapshot is exported for the chunk's
    readers; after it ends, the WAL insert position (``ChunkSnapshot.high``)."""
    with connect(params, label=f"{label}, a backfill's snapshot") as conn:
        set_session(conn, READER_SETTINGS)
        # a lock another statement holds on a published table (the description reads their
        # sizes) ends the chunk in seconds: it is copied after the next window instead
        set_session(conn, long_work_settings(conn.info.server_version, lock_timeout_ms=10_000))
        conn.autocommit = False
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        name = _one(conn, _EXPORT)["name"]
        chunk = ChunkSnapshot(conn=conn, name=str(name), files=_files(conn, relid))
        try:
            yield chunk
        finally:
            conn.rollback()
        conn.autocommit = True
        chunk.high = LSN(_one(conn, _FLUSHED_PAST)["lsn"])


def _one(conn: Conn, statement: sql.SQL, args: dict[str, object] | None = None) -> dict[str, Any]:
    row: dict[str, Any] | None = conn.execute(statement, args).fetchone()
    assert row is not None
    return row
