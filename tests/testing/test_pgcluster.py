"""Throwaway PostgreSQL clusters (``testing.pgcluster``): connection strings that carry any
name and password intact, where the server binaries are looked for and what is said when there
are none, the OS user servers run as under root, statements run in a session of their own, a
cluster started again on another port when its port was taken meanwhile, and one in a
temporary directory stopped and removed afterwards."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_pglogrepl.testing import pgcluster
from airflow_pglogrepl.testing.pgcluster import (
    INSTALL_HINT,
    ClusterError,
    PgCluster,
    find_bindir,
    free_port,
    local_cluster,
    server_os_user,
    start_cluster,
)

ODD = "p@ss:w/rd ?#%&='é"


def _cluster(tmp_path: Path, **kwargs: str) -> PgCluster:
    return PgCluster(name="c", basedir=tmp_path, port=5999, bindir=tmp_path, settings={},
                     **kwargs)  # type: ignore[arg-type]  # fmt: skip


def test_connection_strings_carry_any_name_and_password_intact(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, superuser="sü per", password=ODD)
    parsed = conninfo_to_dict(cluster.dsn("db/with ?odd#name"))
    assert parsed == {"user": "sü per", "password": ODD, "host": "127.0.0.1", "port": "5999",
                      "dbname": "db/with ?odd#name"}  # fmt: skip
    assert cluster.airflow_uri("d", conn_type="pglogrepl").startswith(
        "pglogrepl://s%C3%BC%20per:p%40ss%3Aw%2Frd%20%3F%23%25%26%3D%27%C3%A9@127.0.0.1:5999/d"
    )
    assert cluster.params("d", sslmode="disable") == {
        "host": "127.0.0.1", "port": "5999", "user": "sü per", "password": ODD, "dbname": "d",
        "sslmode": "disable",
    }  # fmt: skip


def test_a_cluster_never_started_is_not_stopped_and_has_no_log(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    cluster.stop()  # no pg_ctl: the bindir holds none, and nothing is asked of it
    assert cluster.log_tail() == "(no server log)"
    cluster.logfile.write_text("".join(f"line {n}\n" for n in range(100)))
    assert cluster.log_tail(3) == "line 97\nline 98\nline 99"


def test_the_binaries_are_found_where_pointed_and_their_absence_says_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("initdb", "pg_ctl", "postgres"):
        (fake / tool).touch()
    monkeypatch.setenv("PGLOGREPL_PG_BINDIR", str(fake))
    assert find_bindir() == fake  # before pg_config, Debian's folders and PATH
    (fake / "pg_ctl").unlink()  # incomplete: not taken
    monkeypatch.setattr(pgcluster.shutil, "which", lambda name: None)
    monkeypatch.setattr(pgcluster.glob, "glob", lambda pattern: [])
    with pytest.raises(ClusterError) as missing:
        find_bindir()
    assert str(missing.value) == INSTALL_HINT and "PGLOGREPL_PG_BINDIR" in INSTALL_HINT


def test_under_root_servers_run_as_an_existing_unprivileged_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert server_os_user() is None  # not root: servers run as we do
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PGLOGREPL_PG_OS_USER", "root")
    found = server_os_user()
    assert found is not None and found.pw_uid == 0
    monkeypatch.setenv("PGLOGREPL_PG_OS_USER", "no_such_pglogrepl_user")
    with pytest.raises(ClusterError, match=r"the OS user 'no_such_pglogrepl_user' to run "
                       r"PostgreSQL as does not exist\. Fix: create it \('useradd --system "
                       r"no_such_pglogrepl_user'\) or set PGLOGREPL_PG_OS_USER"):  # fmt: skip
        server_os_user()


def test_a_free_port_can_be_listened_on() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_statements_run_in_sessions_of_their_own(publisher: PgCluster) -> None:
    name = 'pgcluster ünit "db"'
    publisher.create_database(name)
    assert publisher.execute("SELECT current_database()", dbname=name) == [(name,)]
    assert publisher.execute("SET application_name = 'x'") == []  # no rows: an empty list
    assert publisher.execute("SELECT %s::int + 1", (41,)) == [(42,)]
    with publisher.connect(name) as conn:
        assert conn.autocommit
    with publisher.connect(name, autocommit=False) as conn:
        assert not conn.autocommit


def test_a_port_taken_meanwhile_is_given_up_for_another(
    publisher: PgCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between choosing a port and starting, another server may take it: the start is tried
    again on a new one."""
    ports = iter([publisher.port])  # taken: the publisher listens there
    monkeypatch.setattr(pgcluster, "free_port", lambda: next(ports, None) or free_port())
    base = Path(tempfile.mkdtemp(prefix="pglogrepl-retried-"))  # the server's user enters it
    os.chmod(base, 0o755)
    try:
        cluster = start_cluster("retried", base / "cluster", bindir=publisher.bindir)
        try:
            assert cluster.port != publisher.port and cluster.started
            assert cluster.execute("SHOW wal_level") == [("logical",)]
        finally:
            cluster.stop()
        assert not cluster.started
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.live
def test_a_local_cluster_is_stopped_and_removed_afterwards() -> None:
    with local_cluster("probe", {"wal_level": "replica"}) as cluster:
        assert cluster.execute("SHOW wal_level") == [("replica",)]
        dsn, basedir = cluster.dsn(), cluster.basedir.parent
    assert not basedir.exists() and not cluster.started
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=5)
