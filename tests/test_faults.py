"""Crash and pause injection, as the failure tests use it: a named point kills the process the
n-th time it is passed, with nothing cleaned up; a pause waits for the test's signal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from airflow_pglogrepl import faults
from airflow_pglogrepl.testing.wait import wait_until

# passes the point three times, printing before each pass: the output shows where it died
RUN = (
    "from airflow_pglogrepl.faults import fault\n"
    "for n in (1, 2, 3):\n"
    "    print(n, flush=True)\n"
    "    fault('window_written')\n"
    "print('done', flush=True)\n"
)


def run(spec: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("_PGLOGREPL_FAULT")}
    env.pop(faults.FAULT_ENV, None)
    if spec is not None:
        env[faults.FAULT_ENV] = spec
    return subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "status", "printed"),
    [
        (None, 0, "1 2 3 done"),
        ("window_written", 137, "1"),  # the first pass, by default
        ("window_written:2", 137, "1 2"),
        ("window_written:4", 0, "1 2 3 done"),  # never passed that often
        ("other_point", 0, "1 2 3 done"),
    ],
)
def test_a_fault_kills_at_its_point_the_nth_time(
    spec: str | None, status: int, printed: str
) -> None:
    result = run(spec)
    assert result.returncode == status, result.stderr
    assert result.stdout.split() == printed.split()


def test_a_pause_waits_for_the_tests_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.PAUSE_ENV, f"before_commit:{tmp_path}")
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (faults.pause("before_commit"), done.set()), daemon=True
    )
    thread.start()
    marker = tmp_path / f"before_commit.{os.getpid()}"
    wait_until(marker.exists, what="the pause's marker", timeout=10)
    assert not done.is_set()  # waiting: the test does its work now
    (tmp_path / "go").touch()
    thread.join(timeout=10)
    assert done.is_set()
    faults.pause("elsewhere")  # another point does not wait
