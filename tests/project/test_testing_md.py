"""docs/testing.md runs as written: its Python blocks as the files they are titled with (the DAG,
``conftest.py``, the test, run by pytest in a process of its own), and its shell walk-through
(clusters from the shell, ``airflow dags test``, stop) as one bash script.

Both run the way a reader would: in an empty folder holding only the page's files, with an
environment that carries none of this suite's Airflow settings (``AIRFLOW_HOME``, connections),
so the page has to set up everything it uses itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl.testing import shell
from tests.support.markdown import Block, code_blocks, materialize
from tests.support.paths import REPO

PAGE = REPO / "docs" / "testing.md"
# A connection URI whose password Airflow did not mask: user:password@ (masked reads user:***@).
UNMASKED_URI = re.compile(r"://[^:/@\s]+:(?!\*\*\*@)[^@\s]+@")


def blocks(lang: str) -> list[Block]:
    found = [block for block in code_blocks(PAGE) if block.lang == lang]
    assert found, f"no {lang} blocks in {PAGE}"
    return found


@pytest.fixture
def scratch() -> Iterator[Path]:
    """The temporary directory the page's commands make theirs in (``TMPDIR``); world-enterable,
    because as root the servers run as another OS user. Any cluster still running in it when the
    test ends (a step failed before ``stop``) is stopped."""
    base = Path(tempfile.mkdtemp(prefix="pglogrepl-docs-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        for pid_file in base.rglob("postmaster.pid"):
            shell.main(["stop", str(pid_file.parent.parent)])
        shutil.rmtree(base, ignore_errors=True)


def reader_environment(scratch: Path) -> dict[str, str]:
    """This process's environment without Airflow's settings, with this checkout's package and
    this interpreter's ``python``, ``pytest`` and ``airflow`` first on the path."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIRFLOW", "PYTEST_"))
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(scratch)
    return env


def test_every_python_block_is_a_titled_file() -> None:
    """A block without a file name would not be run by the tests below."""
    untitled = [block.body.splitlines()[0] for block in blocks("python") if block.title is None]
    assert not untitled, f'python blocks in {PAGE.name} need a title="file.py": {untitled}'


@pytest.mark.live  # the page's conftest.py starts clusters and migrates an Airflow database
@pytest.mark.airflow
def test_python_blocks_run_as_written(scratch: Path, tmp_path: Path) -> None:
    files = materialize(blocks("python"), tmp_path)
    tests = sum(
        path.read_text().count("\ndef test_") for path in files if path.name.startswith("test_")
    )
    assert tests, f"{PAGE.name} defines no test function"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=reader_environment(scratch),
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"{tests} passed" in output, output[-3000:]


@pytest.mark.live  # the page's commands start clusters, airflow db migrate and dags test
@pytest.mark.airflow
def test_airflow_dags_test_walkthrough(scratch: Path, tmp_path: Path) -> None:
    materialize(blocks("python"), tmp_path)  # dags/orders_replication.py
    script = "\n".join(block.body for block in blocks("bash"))
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=reader_environment(scratch),
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "started publisher on 127.0.0.1:" in output and "stopped replica" in output
    assert re.search(r"^\s*1 \|\s*9\.50\s*$", result.stdout, re.M), result.stdout[-3000:]
    assert not UNMASKED_URI.search(output), "a connection's password was printed"
    assert "AIRFLOW_CONN_" not in result.stdout, "an export line was printed, not eval'ed"
    leftovers = list(scratch.rglob("PG_VERSION"))
    assert not leftovers, f"stop --remove left clusters behind: {leftovers}"
