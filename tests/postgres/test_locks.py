"""The writer lock against a live server: one holder, proven before commits, and lost (and
said so) when its session ends, but not ended by the server's idle timeouts."""

from __future__ import annotations

import psycopg
import pytest

from airflow_pglogrepl.exceptions import LakeWriterBusyError, WriterLockLostError
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.sources import Source


def test_the_lock_is_proven_while_held_and_lost_when_its_session_is_ended(source: Source) -> None:
    hook = source.hook()
    with hook.writer_lock(source.slot) as lock:
        lock.check()
        with pytest.raises(LakeWriterBusyError), hook.writer_lock(source.slot):
            pass
        source.sql("SELECT pg_terminate_backend(%s)", (lock.pid,))
        with pytest.raises(WriterLockLostError, match=r"no longer held by this run .*session"):
            lock.check()
        with hook.writer_lock(source.slot) as other:  # free for the next run at once
            other.check()
            with pytest.raises(WriterLockLostError):  # and the lost one stays lost
                lock.check()


def test_a_lock_released_under_its_session_is_not_taken_for_held(source: Source) -> None:
    hook = source.hook()
    with hook.writer_lock(source.slot) as lock:
        lock._conn.execute("SELECT pg_advisory_unlock_all()")
        with pytest.raises(WriterLockLostError, match=rf"backend {lock.pid} no longer holds it"):
            lock.check()


def test_the_roles_idle_session_timeout_does_not_end_the_lock(source: Source) -> None:
    """Before: the holding session got no settings of its own, so a role's
    ``idle_session_timeout`` ended it while the run went on, and a second run was granted the
    lock beside the first."""
    role = f"idle_{source.slot}"[:63]
    source.sql(f"CREATE ROLE \"{role}\" LOGIN SUPERUSER PASSWORD 'pw'")
    source.sql(f'ALTER ROLE "{role}" IN DATABASE "{source.db}" SET idle_session_timeout = \'1s\'')
    params = {**source.cluster.params(source.db), "user": role, "password": "pw"}
    from airflow_pglogrepl.conninfo import make_dsn
    from airflow_pglogrepl.postgres.source import PgSource

    try:
        as_role = PgSource(make_dsn(params))
        with as_role.writer_lock(source.slot) as lock:
            # a session of the same role that is idle for less time than the lock's: once the
            # server ended it, the lock's session would have been ended too
            probe = psycopg.connect(make_dsn(params), autocommit=True)
            probe_pid = probe.info.backend_pid
            probe.execute("SELECT 1")

            def probe_ended() -> bool:
                rows = source.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (probe_pid,))
                return not rows

            wait_until(probe_ended, what="the role's idle_session_timeout ending a session")
            probe.close()
            lock.check()
            with pytest.raises(LakeWriterBusyError), as_role.writer_lock(source.slot):
                pass
    finally:
        source.sql(f'DROP ROLE IF EXISTS "{role}"')
