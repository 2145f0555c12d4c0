"""The locks an initial snapshot holds on the tables it copies, and what it does about DDL.

A table rewrite (``VACUUM FULL``, ``CLUSTER``, ``TRUNCATE``, pg_repack, a rewriting ``ALTER
TABLE``) is not MVCC-safe: a snapshot taken before it sees the new file empty (``ALTER``,
``TRUNCATE``) or its rows at other ctids (``VACUUM FULL``, ``CLUSTER``), and the rewrite sends
no change the drain could repair with. The copy is many sessions reading ctid ranges over
minutes or hours, so one more session, the guard, imports the snapshot too and holds ``ACCESS
SHARE`` on every copied table until the copy is done, as pg_dump does: no rewrite can commit
meanwhile. Once it holds the locks, it checks that no rewrite committed between the snapshot's
consistent point and the lock: the file node the snapshot's catalog shows against the current
one (``pg_relation_filenode``).

PostgreSQL grants locks in queue order. A statement waiting for ``ACCESS EXCLUSIVE`` behind the
guard's lock would make every reader that starts after it wait too, and nothing would move
until a timeout. So while the copy runs, a watcher cancels such a statement once one of the
snapshot's readers waits behind it, and logs which one it was: a statement that can wait until
the copy is done, waits. See
https://www.postgresql.org/docs/15/explicit-locking.html and
https://www.postgresql.org/docs/15/mvcc-caveats.html
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.exceptions import (
    CatalogChangedError,
    PgLogReplError,
    SnapshotLockError,
    TableRewrittenError,
)
from airflow_pglogrepl.models.records import Record
from airflow_pglogrepl.postgres.connect import Conn, connect, long_work_settings, set_session
from airflow_pglogrepl.postgres.server import source_identity
from airflow_pglogrepl.postgres.snapshot import SnapshotReader, SnapshotTable
from airflow_pglogrepl.tables import TableRef

__all__ = ["CanceledStatement", "SnapshotGuard", "readers_application_name"]

log = logging.getLogger("airflow_pglogrepl.snapshot")
T = TypeVar("T")

# Sessions holding or waiting for a lock that conflicts with ACCESS SHARE, on the relation, or
# (NULL) on any relation of this database; ``regclass`` output reads the catalog cache and
# takes no lock.
_HOLDERS = """
SELECT a.pid, a.usename AS role, coalesce(a.application_name, '') AS application_name,
    l.granted, l.relation::regclass::text AS relation
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock'
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND (l.relation = %s OR %s::oid IS NULL) AND a.pid <> pg_backend_pid()
ORDER BY l.granted DESC, a.pid
"""

# The file node of each copied table (and each leaf partition of a partitioned one) in the
# snapshot's catalog (``pg_class`` read in the transaction's snapshot) and now (the relation
# cache, which taking the lock brought up to date). NULL now: dropped meanwhile.
_FILENODES = """
SELECT n.nspname AS schema_name, c.relname AS table_name, c.relfilenode::int8 AS at_snapshot,
    pg_relation_filenode(c.oid)::int8 AS now
FROM (SELECT unnest(%(roots)s::oid[]) AS oid
      UNION
      SELECT t.relid FROM unnest(%(roots)s::oid[]) AS r(oid)
      CROSS JOIN LATERAL pg_partition_tree(r.oid) AS t WHERE t.isleaf) AS rel
JOIN pg_class c ON c.oid = rel.oid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm', 't')
"""

# A session waiting for ACCESS EXCLUSIVE on a copied relation (a condition both queries below
# repeat: the cancel checks it again, in its own statement, just before it signals).
_WAITS_EXCLUSIVE = """EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = {pid} AND NOT l.granted
    AND l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock'
    AND l.relation = ANY(%(relids)s::oid[]))"""

# Statements a reader of this snapshot (same role, its application name) waits behind that wait
# for ACCESS EXCLUSIVE on a copied relation themselves: nothing else is ever canceled (a name
# in pg_stat_activity is no proof; a role's own sessions and the lock it waits for are).
_QUEUED = """
SELECT DISTINCT w.pid, w.query_start, w.usename AS role,
    coalesce(w.application_name, '') AS application_name,
    coalesce(substring(w.query from '^\\s*([A-Za-z]+(\\s+[A-Za-z]+)?)'), '') AS statement
FROM pg_stat_activity r
CROSS JOIN LATERAL unnest(pg_blocking_pids(r.pid)) AS b(pid)
JOIN pg_stat_activity w ON w.pid = b.pid
WHERE r.application_name = %(readers)s AND r.usename = current_user AND w.pid <> %(guard)s
    AND """ + _WAITS_EXCLUSIVE.format(pid="w.pid")
_CANCEL = "SELECT pg_cancel_backend(%(pid)s) AS ok WHERE " + _WAITS_EXCLUSIVE.format(pid="%(pid)s")

# What the copy depends on in the catalog, as rows that compare equal while nothing changed:
# the publications' definitions and memberships, each copied table's partition tree and
# columns. Run in the snapshot and in a fresh session: any difference means the catalog moved
# after the consistent point (a table added to a publication, a partition attached, columns
# renamed) and the copy would not be the table at the snapshot.
_FINGERPRINT = """
WITH RECURSIVE tree(relid) AS (
    SELECT unnest(%(roots)s::oid[])
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid
        JOIN pg_class c ON c.oid = tree.relid WHERE c.relkind = 'p'),
pubs AS (SELECT * FROM pg_publication WHERE pubname = ANY(%(pubs)s))
SELECT 'publication' AS kind, pubname::text AS name,
    concat_ws(',', puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot)
        AS detail FROM pubs
UNION ALL
SELECT 'member', p.pubname || ':' || pr.prrelid::regclass::text,
    concat_ws(',', pr.prqual::text, pr.prattrs::text)
FROM pg_publication_rel pr JOIN pubs p ON p.oid = pr.prpubid
UNION ALL
SELECT 'schema', p.pubname || ':' || pn.pnnspid::regnamespace::text, ''
FROM pg_publication_namespace pn JOIN pubs p ON p.oid = pn.pnpubid
UNION ALL
SELECT 'partition', i.inhparent::regclass::text, i.inhrelid::regclass::text
FROM pg_inherits i WHERE i.inhparent IN (SELECT relid FROM tree)
    AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = i.inhparent AND c.relkind = 'p')
UNION ALL
SELECT 'column', a.attrelid::regclass::text || '.' || a.attnum,
    concat_ws(',', a.attname, a.atttypid, a.atttypmod, a.attisdropped, a.attgenerated)
FROM pg_attribute a WHERE a.attrelid IN (SELECT relid FROM tree) AND a.attnum > 0
ORDER BY 1, 2, 3
"""


def readers_application_name(snapshot_name: str) -> str:
    """The ``application_name`` of the snapshot's readers, which the watcher looks for."""
    return f"pglogrepl snapshot {snapshot_name}"[:63]


@dataclass(frozen=True)
class CanceledStatement(Record):
    """A statement the watcher canceled (or could not) because a reader waited behind it."""

    pid: int
    role: str
    application_name: str
    statement: str
    canceled: bool


class SnapshotGuard:
    """A session in the snapshot that locks the copied tables for as long as it is open.

    Use as a context manager: ``locked_tables`` reads the tables to copy at the snapshot, locks
    them and checks for rewrites; ``watch`` keeps the readers moving.
    """

    def __init__(
        self, params: Mapping[str, str], snapshot_name: str, *, label: str = SOURCE_DSN_ENV
    ) -> None:
        self.params = {k: str(v) for k, v in params.items()}
        self.snapshot_name = snapshot_name
        self.label = label
        self.reader = SnapshotReader(self.params, label=label)
        self._stack = ExitStack()
        self._conn: Conn | None = None
        self._publications: list[str] = []
        self._roots: list[int] = []

    def __enter__(self) -> SnapshotGuard:
        try:
            conn = self._stack.enter_context(self.reader.transaction(self.snapshot_name))
            set_session(conn, {"search_path": "pg_catalog"})  # only our statements run here
            self._conn = conn
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn = None
        self._stack.close()

    @property
    def conn(self) -> Conn:
        if self._conn is None:
            raise RuntimeError("SnapshotGuard is used outside its with block")
        return self._conn

    def locked_tables(
        self,
        publications: Sequence[str],
        tables: Sequence[TableRef] | None,
        *,
        timeout_s: float,
    ) -> list[SnapshotTable]:
        """The tables to copy as the snapshot sees them (``SnapshotReader.published_tables``),
        each locked ``IN ACCESS SHARE MODE`` (a partitioned one with its partitions) for as long
        as the guard is open; refused if any was rewritten or replaced since the snapshot.
        Lock waits take at most ``timeout_s`` in all (reading the catalog locks the tables too).

        :raises SnapshotLockError: a lock was not granted in time (names who holds it).
        :raises TableRewrittenError: a table was rewritten between the snapshot and its lock.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        found = self._locking(
            deadline, timeout_s, None, "the published tables",
            lambda: self.reader.published_tables(self.conn, publications, tables),
        )  # fmt: skip
        for table in found:
            # ONLY for a plain table: it is copied without its inheritance children (they are
            # published, and copied, as tables of their own); a partitioned one with its
            # partitions, which its read goes through
            statement = sql.SQL("LOCK TABLE {}{} IN ACCESS SHARE MODE").format(
                sql.SQL("" if table.relkind == "p" else "ONLY "),
                sql.Identifier(table.table.schema, table.table.name),
            )
            self._locking(deadline, timeout_s, table.relid, str(table.table),
                          partial(self.conn.execute, statement))  # fmt: skip
        set_session(self.conn, {"lock_timeout": "0"})
        self._publications = list(publications)
        self._roots = [t.relid for t in found]
        self._check_not_rewritten(found)
        self.verify()
        log.info("snapshot %s holds ACCESS SHARE on %d table(s) until the copy is done",
                 self.snapshot_name, len(found))  # fmt: skip
        return found

    def _locking(
        self, deadline: float, timeout_s: float, relid: int | None, what: str, work: Callable[[], T]
    ) -> T:
        """``work()`` with the lock waits it does bounded by ``deadline``."""
        conn = self.conn
        conn.execute("SAVEPOINT pglogrepl_lock")
        try:
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            set_session(conn, {"lock_timeout": str(remaining_ms)})
            result = work()
        except pgerr.LockNotAvailable:
            conn.execute("ROLLBACK TO SAVEPOINT pglogrepl_lock")
            holders = [
                f"pid {r['pid']} (role {r['role']}, application {r['application_name']!r}) "
                f"{'holds' if r['granted'] else 'waits for'} it on {r['relation']}"
                for r in conn.execute(_HOLDERS, (relid, relid)).fetchall()
            ]
            raise SnapshotLockError(what, timeout_s, holders) from None
        conn.execute("RELEASE SAVEPOINT pglogrepl_lock")
        return result

    def _check_not_rewritten(self, tables: Sequence[SnapshotTable]) -> None:
        conn = self.conn
        changed: list[str] = []
        rows = conn.execute(_FILENODES, {"roots": [t.relid for t in tables]}).fetchall()
        for row in rows:
            if row["now"] is None or row["now"] != row["at_snapshot"]:
                changed.append(f"{row['schema_name']}.{row['table_name']}")
        for table in tables:  # dropped and created again under the same name
            name = sql.Identifier(table.table.schema, table.table.name).as_string(conn)
            now = conn.execute("SELECT to_regclass(%s)::oid::int8 AS oid", (name,)).fetchone()
            if now is None or now["oid"] != table.relid:
                changed.append(str(table.table))
        if changed:
            raise TableRewrittenError(sorted(set(changed)))

    def source_identity(self) -> dict[str, object]:
        """The server's identity (``server.source_identity``), recorded with the commit."""
        return source_identity(self.conn)

    def verify(self) -> None:
        """Refuse when what the copy depends on in the catalog (``_FINGERPRINT``) differs
        between the snapshot and now: a table added to or dropped from a publication, a row
        filter or column list changed, a partition attached or detached, columns renamed or
        retyped. Called once the tables are locked, and again before the commit point (an
        ``ATTACH PARTITION`` does not wait for the locks).

        :raises CatalogChangedError: what differs (at most ten lines of it).
        """
        arguments = {"roots": self._roots, "pubs": self._publications}
        then = [tuple(r.values()) for r in self.conn.execute(_FINGERPRINT, arguments)]
        with connect(self.params, label=self.label, application_name="pglogrepl verify") as c:
            set_session(c, {"search_path": "pg_catalog"})
            now = [tuple(r.values()) for r in c.execute(_FINGERPRINT, arguments)]
        if then != now:
            before, after = set(then), set(now)
            lines = [f"at the snapshot {_line(r)}" for r in sorted(before - after)]
            lines += [f"now {_line(r)}" for r in sorted(after - before)]
            raise CatalogChangedError(lines)

    @contextmanager
    def watch(self, *, interval_s: float = 0.5) -> Iterator[list[CanceledStatement]]:
        """While the block runs, cancel any statement a reader of this snapshot waits behind
        (a queued ``ACCESS EXCLUSIVE`` request); yields the list of what was canceled."""
        seen: list[CanceledStatement] = []
        stop = threading.Event()
        guard_pid = self.conn.info.backend_pid
        readers = readers_application_name(self.snapshot_name)
        # read here: the guard's connection is not for the watcher's thread
        arguments = {"readers": readers, "guard": guard_pid, "relids": self._relids()}
        watcher = threading.Thread(
            target=self._watch, args=(arguments, interval_s, stop, seen),
            name="pglogrepl-snapshot-watch", daemon=True,
        )  # fmt: skip
        watcher.start()
        try:
            yield seen
        finally:
            stop.set()
            watcher.join(timeout=10)

    def _watch(
        self,
        arguments: dict[str, Any],
        interval_s: float,
        stop: threading.Event,
        seen: list[CanceledStatement],
    ) -> None:
        handled: set[tuple[int, Any]] = set()  # a statement, not a session: retries come again
        try:
            with connect(self.params, label=self.label, application_name="pglogrepl watch") as c:
                set_session(c, {"search_path": "pg_catalog"})
                set_session(c, long_work_settings(c.info.server_version))
                while not stop.wait(interval_s):
                    for row in c.execute(_QUEUED, arguments).fetchall():
                        if (row["pid"], row["query_start"]) in handled:
                            continue
                        handled.add((row["pid"], row["query_start"]))
                        seen.append(_cancel(c, row, arguments))
        except (psycopg.Error, PgLogReplError) as exc:  # the readers' lock_timeout still holds
            log.warning("the snapshot's lock watcher stopped: %s", exc)

    def _relids(self) -> list[int]:
        """The copied tables and every partition below them (what readers lock)."""
        rows = self.conn.execute(
            "WITH RECURSIVE tree(relid) AS (SELECT unnest(%s::oid[]) UNION"
            " SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)"
            " SELECT relid::int8 AS relid FROM tree",
            (self._roots,),
        ).fetchall()
        return [row["relid"] for row in rows]


def _line(row: tuple[Any, ...]) -> str:
    return " ".join(str(value) for value in row if value not in ("", None))


def _cancel(conn: Conn, row: dict[str, Any], arguments: dict[str, Any]) -> CanceledStatement:
    try:
        ok = conn.execute(_CANCEL, {**arguments, "pid": row["pid"]}).fetchone()
        canceled = bool(ok and ok["ok"])
    except pgerr.InsufficientPrivilege:
        canceled = False
    statement = CanceledStatement(
        pid=row["pid"],
        role=row["role"] or "",
        application_name=row["application_name"],
        statement=row["statement"],
        canceled=canceled,
    )
    if canceled:
        log.warning(
            "canceled %s (pid %d, role %s, application %r): it waited for an exclusive lock on "
            "a table the snapshot copies, and the snapshot's readers queued behind it. Run it "
            "again once the snapshot is done",
            statement.statement or "a statement", statement.pid, statement.role,
            statement.application_name,
        )  # fmt: skip
    else:
        log.warning(
            "%s (pid %d, role %s) waits for an exclusive lock on a table the snapshot copies, "
            "and the snapshot's readers wait behind it; this role may not cancel it "
            "(pg_signal_backend). The readers give up after their lock_timeout",
            statement.statement or "a statement", statement.pid, statement.role,
        )  # fmt: skip
    return statement
