"""Throwaway PostgreSQL clusters on loopback, for the test suite, the demo and the benchmarks.

``initdb`` refuses to run as root, and CI runs as root: then every server command runs as an
unprivileged OS user (``postgres`` when it exists, or ``PGLOGREPL_PG_OS_USER``), and the cluster's
directory is handed to that user. Host connections need a password (SCRAM), so tests exercise the
same authentication path as production; the superuser's password is random per cluster.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

# Enough slots, senders and workers for several subscriptions with parallel table sync.
LOGICAL_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "max_logical_replication_workers": "16",
    "max_worker_processes": "24",
    "max_sync_workers_per_subscription": "4",
    "max_prepared_transactions": "8",  # the write fence's tests prepare transactions
    "wal_sender_timeout": "60s",
    # Throwaway data: durability buys nothing here and fsync dominates small-test latency.
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "max_connections": "100",
}

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found. Install them, for "
    "example on Debian/Ubuntu: 'apt-get install postgresql-15' (or run .ci/run, which does), "
    "or point PGLOGREPL_PG_BINDIR at the directory holding initdb"
)


class ClusterError(RuntimeError):
    """A throwaway cluster could not be created, started or stopped."""


def find_bindir() -> Path:
    """Where initdb/pg_ctl are: PGLOGREPL_PG_BINDIR, ``pg_config --bindir``, Debian's, PATH."""
    candidates: list[str] = []
    if os.environ.get("PGLOGREPL_PG_BINDIR"):
        candidates.append(os.environ["PGLOGREPL_PG_BINDIR"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(out.stdout.strip())
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        path = Path(candidate)
        if candidate and all((path / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return path
    raise ClusterError(INSTALL_HINT)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_os_user() -> pwd.struct_passwd | None:
    """The unprivileged user servers run as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("PGLOGREPL_PG_OS_USER", "postgres")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ClusterError(
            f"running as root, and initdb refuses root; the OS user {name!r} to run PostgreSQL "
            f"as does not exist. Fix: create it ('useradd --system {name}') or set "
            f"PGLOGREPL_PG_OS_USER to an existing unprivileged user"
        ) from None


def servable_bindir(bindir: Path) -> Path:
    """``bindir``, or a copy of its installation the server's OS user can run.

    As root the servers run as an unprivileged user, who cannot run binaries that sit in a
    private home (a clone under ``/root`` fetching ``make pg-binaries``). Then the installation
    (``bindir``'s parent as a whole, links kept: relocatable builds) is copied once to a
    world-readable folder under the temporary directory, named by its path and modification
    time, and reused.
    """
    user = server_os_user()
    if user is None or _runs_as(user, bindir / "postgres"):
        return bindir
    install = bindir.absolute().parent
    digest = hashlib.sha256(f"{install}:{install.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"pglogrepl-pg-{user.pw_name}-{digest}"
    if target.exists() and target.stat().st_uid != os.geteuid():
        raise ClusterError(
            f"{target} exists but is not ours (owner uid {target.stat().st_uid}); it would run "
            f"as the server. Fix: remove it"
        )
    if not (target / bindir.name / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
        shutil.copytree(install, staging / "install", symlinks=True)
        os.chmod(staging, 0o755)
        with contextlib.suppress(OSError):  # another process won the race: its copy is as good
            os.rename(staging / "install", target)
        shutil.rmtree(staging, ignore_errors=True)
        os.chmod(target, 0o755)
    if not _runs_as(user, target / bindir.name / "postgres"):
        raise ClusterError(
            f"the OS user {user.pw_name!r} cannot run {bindir / 'postgres'}, nor a copy of it in "
            f"{target}. Fix: put the PostgreSQL binaries where that user can read them"
        )
    return target / bindir.name


def _runs_as(user: pwd.struct_passwd, program: Path) -> bool:
    try:
        result = subprocess.run(
            [str(program), "--version"],
            capture_output=True,
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            check=False,
        )
    except OSError:
        return False
    return result.returncode == 0


@dataclass
class PgCluster:
    """One cluster: its directory, port and superuser credentials."""

    name: str
    basedir: Path
    port: int
    bindir: Path
    settings: Mapping[str, str]
    superuser: str = "postgres"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    host: str = "127.0.0.1"
    started: bool = False
    initdb_options: tuple[str, ...] = ()  # (``--no-data-checksums``: a pg_upgrade target)

    @property
    def datadir(self) -> Path:
        return self.basedir / "data"

    @property
    def logfile(self) -> Path:
        return self.basedir / "server.log"

    @property
    def socket_dir(self) -> Path:
        return self.basedir / "sock"

    # -- connection details ---------------------------------------------------------------

    def params(self, dbname: str = "postgres", **extra: str) -> dict[str, str]:
        """libpq keyword parameters for the superuser over TCP."""
        return {
            "host": self.host,
            "port": str(self.port),
            "user": self.superuser,
            "password": self.password,
            "dbname": dbname,
            **extra,
        }

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URI for the superuser (contains the password)."""
        return (
            f"postgresql://{quote(self.superuser, safe='')}:{quote(self.password, safe='')}"
            f"@{self.host}:{self.port}/{quote(dbname, safe='')}"
        )

    def airflow_uri(self, dbname: str = "postgres", conn_type: str = "postgres") -> str:
        """An Airflow connection URI (``AIRFLOW_CONN_X``) for the superuser."""
        return (
            f"{conn_type}://{quote(self.superuser, safe='')}:{quote(self.password, safe='')}"
            f"@{self.host}:{self.port}/{quote(dbname, safe='')}"
        )

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> Any:
        """An autocommit psycopg connection as superuser (psycopg imported lazily)."""
        import psycopg

        from airflow_pglogrepl.conninfo import make_dsn

        kwargs.setdefault("autocommit", True)
        return psycopg.connect(make_dsn(self.params(dbname)), **kwargs)

    def execute(self, statement: Any, params: Any = None, dbname: str = "postgres") -> list[Any]:
        """Run one statement in its own session; return its rows (empty when none)."""
        with self.connect(dbname) as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def create_database(self, dbname: str) -> None:
        """CREATE DATABASE (any name; composed as an identifier)."""
        from psycopg import sql

        self.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))

    # -- lifecycle ------------------------------------------------------------------------

    def _run(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        user = server_os_user()
        if user is not None:
            kwargs.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        env.pop("PGPASSWORD", None)
        return subprocess.run(args, capture_output=True, text=True, env=env, **kwargs)

    def init(self) -> None:
        """initdb with SCRAM for TCP, trust for the private socket, and our settings."""
        self.basedir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        pwfile = self.basedir / "pwfile"
        pwfile.write_text(self.password + "\n")
        user = server_os_user()
        if user is not None:
            for path in (self.basedir, self.socket_dir, pwfile):
                os.chown(path, user.pw_uid, user.pw_gid)
        result = self._run(
            [
                str(self.bindir / "initdb"),
                "-D", str(self.datadir),
                "-U", self.superuser,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                *self.initdb_options,
            ]
        )  # fmt: skip
        pwfile.unlink()
        if result.returncode != 0:
            raise ClusterError(f"initdb failed for cluster {self.name}:\n{result.stderr}")
        lines = [f"{key} = '{value}'" for key, value in self.settings.items()]
        lines += [
            f"port = {self.port}",
            f"listen_addresses = '{self.host}'",
            f"unix_socket_directories = '{self.socket_dir}'",
            "log_min_messages = warning",
            "log_line_prefix = '%m [%p] %q%u@%d '",
        ]
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write("\n# airflow-pglogrepl test cluster\n" + "\n".join(lines) + "\n")

    def set_port(self, port: int) -> None:
        """Change the port (before start); used when the chosen port was taken meanwhile."""
        self.port = port
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {port}\n")

    def start(self, timeout: int = 60) -> None:
        """pg_ctl start and wait until the server accepts connections."""
        result = self._run(
            [
                str(self.bindir / "pg_ctl"), "start", "-D", str(self.datadir),
                "-l", str(self.logfile), "-w", "-t", str(timeout),
            ]
        )  # fmt: skip
        if result.returncode != 0:
            raise ClusterError(
                f"cluster {self.name} did not start on port {self.port}:\n{result.stderr}\n"
                f"--- server log ---\n{self.log_tail()}"
            )
        self.started = True

    def stop(self, mode: str = "fast", *, timeout: int = 60) -> None:
        """pg_ctl stop (``fast`` by default, ``immediate`` to simulate a crash), waiting up to
        ``timeout`` seconds for the server to go."""
        if not self.started:
            return
        result = self._run(
            [str(self.bindir / "pg_ctl"), "stop", "-D", str(self.datadir), "-m", mode, "-w",
             "-t", str(timeout)]
        )  # fmt: skip
        self.started = False
        if result.returncode != 0 and "not running" not in result.stderr:
            raise ClusterError(f"cluster {self.name} did not stop:\n{result.stderr}")

    def restart(self) -> None:
        """Stop fast and start again (settings that need a restart take effect)."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server log, for error messages."""
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def start_cluster(
    name: str,
    basedir: Path,
    settings: Mapping[str, str] | None = None,
    bindir: Path | None = None,
    attempts: int = 5,
) -> PgCluster:
    """initdb + start a cluster under ``basedir``, retrying on a port taken meanwhile."""
    cluster = PgCluster(
        name=name,
        basedir=basedir,
        port=free_port(),
        bindir=servable_bindir(bindir or find_bindir()),
        settings=dict(LOGICAL_SETTINGS if settings is None else settings),
    )
    cluster.init()
    for attempt in range(attempts):
        try:
            cluster.start()
            return cluster
        except ClusterError:
            if attempt == attempts - 1 or "already in use" not in cluster.log_tail():
                raise
            cluster.set_port(free_port())
            time.sleep(0.2 * (attempt + 1))  # back off before the next port; not a sync point
    raise AssertionError("unreachable")


@contextmanager
def local_cluster(
    name: str,
    settings: Mapping[str, str] | None = None,
    *,
    keep: bool = False,
    bindir: Path | None = None,
) -> Iterator[PgCluster]:
    """A started cluster in a fresh temporary directory; stopped and removed afterwards.

    ``bindir`` picks the server binaries (another major version); ``find_bindir()`` by default.
    """
    basedir = Path(tempfile.mkdtemp(prefix=f"pglogrepl-{name}-"))
    os.chmod(basedir, 0o755)
    cluster = None
    try:
        cluster = start_cluster(name, basedir / "cluster", settings, bindir)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        if not keep:
            shutil.rmtree(basedir, ignore_errors=True)
