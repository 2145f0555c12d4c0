"""``python -m airflow_pglogrepl.testing``: clusters that outlive the process that started them,
stopped from another one, and passwords printed only in the export line asked for."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl.testing.pgcluster import start_cluster
from airflow_pglogrepl.testing.shell import STATE_FILE, main
from tests.support.paths import REPO


@pytest.fixture
def workdir() -> Iterator[Path]:
    """World-enterable (as root the servers run as another OS user); clusters left running in it
    by a failed assertion are stopped."""
    base = Path(tempfile.mkdtemp(prefix="pglogrepl-shell-"))
    os.chmod(base, 0o755)
    yield base
    for pid_file in base.rglob("postmaster.pid"):
        main(["stop", str(pid_file.parent.parent)])
    shutil.rmtree(base, ignore_errors=True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The module as a shell runs it: a process of its own."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "airflow_pglogrepl.testing", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.live
def test_start_env_stop_across_processes(workdir: Path) -> None:
    import psycopg

    basedir = workdir / "publisher"
    started = cli("start", "publisher", "--dir", str(basedir), "--conn-id", "orders_primary")
    assert started.returncode == 0, started.stderr
    name, _, value = started.stdout.strip().removeprefix("export ").partition("=")
    assert name == "AIRFLOW_CONN_ORDERS_PRIMARY"
    uri = shlex.split(value)[0]
    password = uri.split("@")[0].rsplit(":", 1)[1]
    assert password not in started.stderr  # the summary never holds it
    assert stat.S_IMODE((basedir / STATE_FILE).stat().st_mode) == 0o600
    # The server outlived the process that started it; libpq takes Airflow's URI as it is.
    with psycopg.connect(uri) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)

    again = cli("env", str(basedir), "--conn-id", "orders_primary")
    assert again.returncode == 0 and again.stdout == started.stdout

    stopped = cli("stop", str(basedir))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped publisher" in stopped.stderr and password not in stopped.stderr
    assert not (basedir / "data" / "postmaster.pid").exists()
    twice = cli("stop", str(basedir), "--remove")  # a cleanup step after the cluster went down
    assert twice.returncode == 0, twice.stderr
    assert not basedir.exists()


@pytest.mark.live
def test_stop_a_cluster_a_test_process_left_running(workdir: Path) -> None:
    """start_cluster writes no state file: the data directory's postmaster.pid is enough."""
    cluster = start_cluster("orphan", workdir / "orphan")
    stopped = cli("stop", str(cluster.basedir))
    assert stopped.returncode == 0, stopped.stderr
    assert not (cluster.datadir / "postmaster.pid").exists()
    no_password = cli("env", str(cluster.basedir), "--conn-id", "x")
    assert no_password.returncode == 1 and "password is unknown" in no_password.stderr


def test_a_directory_without_a_cluster_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stop", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "holds no cluster" in err and "Traceback" not in err
