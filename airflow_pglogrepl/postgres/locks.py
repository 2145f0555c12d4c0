"""The lake's writer lock: one drain or snapshot per slot at a time, held on the publisher.

A session-level advisory lock keyed by the slot name, held by a dedicated session for the
whole run. PostgreSQL releases it when that session ends, however the run ends (a killed
process closes its socket; a vanished host is noticed by TCP keepalive), so a crashed run
never leaves the lake locked. The lock is taken with ``pg_try_advisory_lock``: a second run
fails at once and names the holder, instead of queueing behind it.

The same property means the lock can end while the run goes on: the session is terminated,
the publisher restarts, a pooler or firewall drops the connection. Every other call of the run
opens a session of its own, so nothing else would notice, and a second run would be granted the
lock and write the same windows. So the holder proves the lock before every lake commit and
every slot advance (``WriterLock.check``: the same backend, the lock still granted to it), and
the holding session gets the long-work settings (no server timeout ends it for being idle) and
TCP keepalives. The commits themselves are compare-and-set on each table's transaction version
(``lake.delta.commit_files``), so even a writer that passed its check and then stalled cannot
commit over another's work.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.exceptions import LakeWriterBusyError, WriterLockLostError
from airflow_pglogrepl.postgres.connect import (
    AsyncConn,
    Conn,
    connect,
    long_work_settings,
    set_session,
)

# First key of the two-key advisory lock form: 'pglr', so our locks are told apart from others.
LOCK_NAMESPACE = 0x70676C72

# libpq TCP keepalives for the holding session, unless the connection sets its own: a host or
# network gone silent is noticed within about a minute, and the lock's proof fails instead of
# waiting for the kernel's two-hour default.
KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "20",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}

_HELD = """
SELECT pg_backend_pid() AS pid,
       EXISTS (SELECT 1 FROM pg_locks AS l
                WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                  AND l.pid = pg_backend_pid()
                  AND l.database = (SELECT oid FROM pg_database
                                     WHERE datname = current_database())
                  AND l.classid = %s::integer::oid AND l.objid = hashtext(%s)::oid) AS held
"""


def try_writer_lock(conn: Conn, slot: str) -> bool:
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS got", (LOCK_NAMESPACE, slot)
    ).fetchone()
    return bool(row and row["got"])


_HOLDER = """
SELECT a.pid, a.application_name, a.client_addr::text AS client_addr,
       a.backend_start::text AS backend_start
  FROM pg_locks AS l
  JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.classid = %s::integer::oid AND l.objid = hashtext(%s)::oid
"""


def writer_lock_holder(conn: Conn, slot: str) -> dict[str, Any] | None:
    """Who holds the lock of ``slot`` (pid, application_name, client_addr, backend_start)."""
    row = conn.execute(_HOLDER, (LOCK_NAMESPACE, slot)).fetchone()
    return dict(row) if row else None


async def awriter_lock_holder(conn: AsyncConn, slot: str) -> dict[str, Any] | None:
    """``writer_lock_holder`` for triggers (non-blocking)."""
    row = await (await conn.execute(_HOLDER, (LOCK_NAMESPACE, slot))).fetchone()
    return dict(row) if row else None


class WriterLock:
    """The writer lock of one slot's lake, held by ``conn`` (backend ``pid``)."""

    def __init__(self, conn: Conn, slot: str, pid: int) -> None:
        self._conn = conn
        self.slot = slot
        self.pid = pid
        self.checks = 0

    def check(self) -> None:
        """Prove the lock is still held, or raise ``WriterLockLostError``: one round trip on
        the holding session, which must be the same backend with the lock still granted."""
        self.checks += 1
        if self._conn.closed or self._conn.broken:
            raise WriterLockLostError(self.slot, "its session is closed")
        try:
            row = self._conn.execute(_HELD, (LOCK_NAMESPACE, self.slot)).fetchone()
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WriterLockLostError(self.slot, f"its session failed: {reason}") from None
        if row is None or row["pid"] != self.pid:
            raise WriterLockLostError(
                self.slot, f"its session is now backend {row and row['pid']}, not {self.pid}"
            )
        if not row["held"]:
            raise WriterLockLostError(self.slot, f"backend {self.pid} no longer holds it")


@contextmanager
def writer_lock(
    params: dict[str, str], slot: str, *, role: str = "drain", label: str = SOURCE_DSN_ENV
) -> Iterator[WriterLock]:
    """Hold the writer lock of ``slot``'s lake in a session of its own, or raise
    ``LakeWriterBusyError`` at once; yields the ``WriterLock`` whose ``check`` proves it.

    The holding session is named ``pglogrepl <role> <slot> <host>:<pid>`` in
    ``pg_stat_activity``, which is what a refused run reports.
    """
    name = f"pglogrepl {role} {slot} {socket.gethostname()}:{os.getpid()}"[:63]
    with connect({**KEEPALIVES, **params}, label=label, application_name=name) as conn:
        set_session(conn, long_work_settings(conn.info.server_version))
        if not try_writer_lock(conn, slot):
            raise LakeWriterBusyError(slot, writer_lock_holder(conn, slot))
        yield WriterLock(conn, slot, conn.info.backend_pid)
