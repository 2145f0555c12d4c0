"""Throwaway clusters from a shell: ``python -m airflow_pglogrepl.testing start|env|stop``.

``airflow dags test`` runs in a process of its own, so the clusters it talks to must outlive the
process that started them. ``start`` runs ``start_cluster`` and returns with the server still
running (``pg_ctl`` detaches it), leaving ``cluster.json`` in the cluster's directory: the port,
the binaries and the throwaway superuser password, readable by its owner only. ``env`` and
``stop`` read it back from another process; ``stop`` needs nothing but the directory, because
``pg_ctl stop`` finds the server through the data directory's ``postmaster.pid``, so it also
stops a cluster a test process started with ``start_cluster`` and never stopped (killed
mid-session): the binaries are then ``find_bindir()``'s.

The password is printed only inside the ``export AIRFLOW_CONN_<ID>=...`` line that ``--conn-id``
and ``env`` exist to print; the rest of the output goes to stderr and never holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from airflow_pglogrepl.testing.pgcluster import (
    ClusterError,
    PgCluster,
    find_bindir,
    servable_bindir,
    server_os_user,
    start_cluster,
)

STATE_FILE = "cluster.json"
PROG = "python -m airflow_pglogrepl.testing"


def save(cluster: PgCluster) -> Path:
    """Write what another process needs to reach and stop ``cluster``; owner-only (password)."""
    path = cluster.basedir / STATE_FILE
    state = {
        "name": cluster.name,
        "host": cluster.host,
        "port": cluster.port,
        "superuser": cluster.superuser,
        "password": cluster.password,
        "bindir": str(cluster.bindir),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(state, out, indent=2)
    return path


def attach(basedir: Path) -> PgCluster:
    """The running cluster under ``basedir`` (the directory given to ``start_cluster``).

    Without ``cluster.json`` (a cluster a test process started) only stopping works: the port
    and password are unknown, the binaries are ``find_bindir()``'s.
    """
    if not (basedir / "data" / "PG_VERSION").exists():
        raise ClusterError(
            f"{basedir} holds no cluster (no data/PG_VERSION). Fix: pass the directory given "
            f"to '{PROG} start --dir' or to start_cluster()"
        )
    state_file = basedir / STATE_FILE
    if not state_file.exists():
        return PgCluster(
            name=basedir.name,
            basedir=basedir,
            port=0,
            bindir=servable_bindir(find_bindir()),
            settings={},
            password="",
            started=True,
        )
    state = json.loads(state_file.read_text())
    return PgCluster(
        name=state["name"],
        basedir=basedir,
        port=int(state["port"]),
        bindir=Path(state["bindir"]),
        settings={},
        superuser=state["superuser"],
        password=state["password"],
        host=state["host"],
        started=True,
    )


def export_line(cluster: PgCluster, *, conn_id: str, dbname: str) -> str:
    """``export AIRFLOW_CONN_<ID>='postgres://...'``: the connection, password included."""
    if not cluster.password:
        raise ClusterError(
            f"{cluster.basedir} has no {STATE_FILE}: it was not started by '{PROG} start', so "
            f"its password is unknown"
        )
    name = "AIRFLOW_CONN_" + conn_id.upper()
    return f"export {name}={shlex.quote(cluster.airflow_uri(dbname))}"


def _start(args: argparse.Namespace) -> int:
    basedir = Path(args.dir).absolute()
    bindir = Path(args.bindir) if args.bindir else None
    try:
        cluster = start_cluster(args.name, basedir, bindir=bindir)
    except ClusterError as exc:
        user = server_os_user()
        hint = (
            f"\n(as root the server runs as the OS user {user.pw_name!r}, which must be able to "
            f"enter every directory above {basedir}: chmod 755 them)"
            if user is not None and "Permission denied" in str(exc)
            else ""
        )
        print(f"{exc}{hint}", file=sys.stderr)
        return 1
    save(cluster)
    print(
        f"started {cluster.name} on {cluster.host}:{cluster.port} (data {cluster.datadir}, "
        f"log {cluster.logfile}); stop it with: {PROG} stop {shlex.quote(str(basedir))}",
        file=sys.stderr,
    )
    if args.conn_id:
        print(export_line(cluster, conn_id=args.conn_id, dbname=args.dbname))
    return 0


def _env(args: argparse.Namespace) -> int:
    cluster = attach(Path(args.dir).absolute())
    print(export_line(cluster, conn_id=args.conn_id, dbname=args.dbname))
    return 0


def _stop(args: argparse.Namespace) -> int:
    basedir = Path(args.dir).absolute()
    cluster = attach(basedir)
    # Stopping twice is not an error: a cleanup step may run after the cluster went down.
    running = (cluster.datadir / "postmaster.pid").exists()
    if running:
        cluster.stop()
    if args.remove:
        shutil.rmtree(basedir)
    done = "stopped" if running else "was not running:"
    print(f"{done} {cluster.name} ({basedir}{', removed' if args.remove else ''})", file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line: ``start``, ``env`` and ``stop``."""
    root = argparse.ArgumentParser(
        prog=PROG,
        description="Throwaway PostgreSQL clusters (wal_level=logical, loopback, SCRAM) for "
        "trying DAGs with 'airflow dags test'. Test data only: the passwords are random and "
        "stored in the cluster's directory.",
    )
    commands = root.add_subparsers(dest="command", required=True)

    start = commands.add_parser("start", help="initdb and start a cluster in DIR")
    start.add_argument("name", help="a name for messages (publisher, subscriber ...)")
    start.add_argument("--dir", required=True, help="a directory that does not exist yet")
    start.add_argument("--bindir", help="server binaries of another major version")
    start.add_argument(
        "--conn-id", help="print 'export AIRFLOW_CONN_<ID>=...' (holds the password) on stdout"
    )
    start.add_argument("--dbname", default="postgres", help="database of the connection")
    start.set_defaults(run=_start)

    env = commands.add_parser("env", help="print 'export AIRFLOW_CONN_<ID>=...' for DIR")
    env.add_argument("dir")
    env.add_argument("--conn-id", required=True)
    env.add_argument("--dbname", default="postgres")
    env.set_defaults(run=_env)

    stop = commands.add_parser("stop", help="stop the cluster in DIR (pg_ctl stop -m fast)")
    stop.add_argument("dir", help="the directory given to 'start --dir' or start_cluster()")
    stop.add_argument("--remove", action="store_true", help="delete DIR once stopped")
    stop.set_defaults(run=_stop)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; errors are one message on stderr and exit status 1, no traceback."""
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ClusterError as exc:
        print(exc, file=sys.stderr)
        return 1
