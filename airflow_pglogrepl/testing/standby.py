"""A streaming standby of a test cluster, and its promotion: what failover tests run against.

The standby is a base backup of the primary (``pg_basebackup``, streaming through a physical
slot of the primary), started with ``hot_standby_feedback`` and, from PostgreSQL 17, failover
slot synchronization on (``sync_replication_slots``; ``primary_conninfo`` names a database).
The caller passes the ``pg_basebackup`` it has (``basebackup``): the build of 16 the tests fetch
carries none, and 18's backs up a 16 or 17 server too.

``synchronized_standby_slots`` is set on the primary only after the backup, with ``ALTER
SYSTEM``: a standby cloned with it set would inherit it, and once promoted, every decode of a
failover slot would wait for a standby slot that does not exist there.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from psycopg import sql

from airflow_pglogrepl.testing.pgcluster import ClusterError, PgCluster, free_port, server_os_user
from airflow_pglogrepl.testing.wait import wait_until

__all__ = ["promote", "start_standby", "synced"]


def _as_server_user() -> dict[str, Any]:
    """``subprocess.run`` arguments that run a program as the servers' OS user, if any."""
    user = server_os_user()
    return {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def start_standby(
    primary: PgCluster,
    basedir: Path,
    *,
    basebackup: Path,
    physical_slot: str = "standby_1",
    hold_back: bool = True,
) -> PgCluster:
    """A started standby of ``primary`` under ``basedir``, streaming through ``physical_slot``
    (created here), with failover slots synchronized to it. ``hold_back``: the primary lets no
    consumer of a failover slot confirm past what the standby has
    (``synchronized_standby_slots``)."""
    primary.execute("SELECT pg_create_physical_replication_slot(%s, true)", (physical_slot,))
    standby = PgCluster(name=f"{primary.name}-standby", basedir=basedir, port=free_port(),
                        bindir=primary.bindir, settings={}, superuser=primary.superuser,
                        password=primary.password)  # fmt: skip
    basedir.mkdir(parents=True, exist_ok=True)
    standby.socket_dir.mkdir(exist_ok=True)
    user = server_os_user()
    if user is not None:
        for path in (basedir, standby.socket_dir):
            os.chown(path, user.pw_uid, user.pw_gid)
    conninfo = (f"host={primary.host} port={primary.port} user={primary.superuser} "
                f"dbname=postgres")  # fmt: skip
    env = {**os.environ, "PGPASSWORD": primary.password, "LC_ALL": "C"}
    done = subprocess.run(
        [str(basebackup), "-D", str(standby.datadir), "-X", "stream", "-S", physical_slot,
         "-c", "fast", "--no-sync", "-d", conninfo],
        capture_output=True, text=True, env=env, timeout=300, **_as_server_user(),
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"pg_basebackup of {primary.name} failed:\n{done.stderr}")
    failover = int(primary.execute("SHOW server_version_num")[0][0]) >= 170000
    # Written here, not by -R: a newer pg_basebackup's -R writes options an older server's
    # libpq refuses (18's ``sslnegotiation`` stopped a 16 standby's WAL receiver).
    (standby.datadir / "standby.signal").touch()
    with (standby.datadir / "postgresql.conf").open("a") as conf:
        conf.write(
            f"\n# standby of {primary.name}\nport = {standby.port}\n"
            f"unix_socket_directories = '{standby.socket_dir}'\nhot_standby_feedback = on\n"
            f"primary_conninfo = '{conninfo} password={primary.password}'\n"
            f"primary_slot_name = '{physical_slot}'\n"
            + ("sync_replication_slots = on\n" if failover else "")
        )
    if user is not None:
        os.chown(standby.datadir / "standby.signal", user.pw_uid, user.pw_gid)
    standby.start()
    wait_until(lambda: primary.execute(
        "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"),
        what=f"{standby.name} streaming from {primary.name}")  # fmt: skip
    if hold_back and failover:
        primary.execute(sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(
            sql.Literal(physical_slot)))  # fmt: skip
        primary.execute("SELECT pg_reload_conf()")
    return standby


def synced(standby: PgCluster, slot: str) -> bool:
    """Whether the standby holds ``slot`` synchronized from its primary."""
    rows = standby.execute(  # (a synced slot stays temporary until it is sync-ready)
        "SELECT synced AND NOT temporary AND invalidation_reason IS NULL"
        " FROM pg_replication_slots WHERE slot_name = %s", (slot,))  # fmt: skip
    return bool(rows and rows[0][0])


def promote(standby: PgCluster) -> None:
    """``pg_ctl promote``, waiting until the standby accepts writes."""
    args = [str(standby.bindir / "pg_ctl"), "promote", "-D", str(standby.datadir), "-w"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, **_as_server_user())
    if done.returncode != 0:
        raise ClusterError(f"{standby.name} was not promoted:\n{done.stderr}")
    wait_until(lambda: not standby.execute("SELECT pg_is_in_recovery()")[0][0],
               what=f"{standby.name} out of recovery")  # fmt: skip
