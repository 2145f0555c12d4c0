"""The lake's writer lock: one drain or snapshot per slot at a time, held on the publisher.

A session-level advisory lock keyed by the slot name, held by a dedicated session for the
whole run. PostgreSQL releases it when that session ends, however the run ends (a killed
process closes its socket; a vanished host is noticed by TCP keepalive), so a crashed run
never leaves the lake locked. The lock is taken with ``pg_try_advisory_lock``: a second run
fails at once and names the holder, instead of queueing behind it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.exceptions import LakeWriterBusyError
from airflow_pglogrepl.hooks.pg.connect import Conn, connect

# First key of the two-key advisory lock form: 'pglr', so our locks are told apart from others.
LOCK_NAMESPACE = 0x70676C72


def try_writer_lock(conn: Conn, slot: str) -> bool:
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS got", (LOCK_NAMESPACE, slot)
    ).fetchone()
    return bool(row and row["got"])


def writer_lock_holder(conn: Conn, slot: str) -> dict[str, Any] | None:
    """Who holds the lock of ``slot`` (pid, application_name, client_addr, backend_start)."""
    row = conn.execute(
        """
        SELECT a.pid, a.application_name, a.client_addr::text AS client_addr,
               a.backend_start::text AS backend_start
          FROM pg_locks AS l
          JOIN pg_stat_activity AS a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid = %s::integer::oid AND l.objid = hashtext(%s)::oid
        """,
        (LOCK_NAMESPACE, slot),
    ).fetchone()
    return dict(row) if row else None


@contextmanager
def writer_lock(
    params: dict[str, str], slot: str, *, role: str = "drain", label: str = SOURCE_DSN_ENV
) -> Iterator[None]:
    """Hold the writer lock of ``slot``'s lake in a session of its own, or raise
    ``LakeWriterBusyError`` at once.

    The holding session is named ``pglogrepl <role> <slot> <host>:<pid>`` in
    ``pg_stat_activity``, which is what a refused run reports.
    """
    name = f"pglogrepl {role} {slot} {socket.gethostname()}:{os.getpid()}"[:63]
    with connect(params, label=label, application_name=name) as conn:
        if not try_writer_lock(conn, slot):
            raise LakeWriterBusyError(slot, writer_lock_holder(conn, slot))
        yield
