"""The drain application run as a child process of the worker (``operators._in_worker``): which
masters run without spark-submit, the session description spark-submit would have built, a
child's lines shown and kept and its exit status returned, and a kill that ends the child and
whatever it started (its own process group)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from airflow_pglogrepl.operators._in_worker import WorkerRun, local_master, spark_settings
from airflow_pglogrepl.testing.wait import wait_until


@pytest.mark.parametrize(
    ("master", "local"),
    [("local", True), ("local[4]", True), ("local[*]", True), (" local[2] ", True),
     ("yarn", False), ("spark://h:7077", False), ("k8s://https://h", False), ("localhost", False),
     ("", False), (None, False)],
)  # fmt: skip
def test_only_a_local_master_runs_on_the_worker(master: str | None, local: bool) -> None:
    assert local_master(master) is local


def test_the_settings_are_the_session_spark_submit_would_have_built() -> None:
    text = spark_settings("local[2]", {"spark.sql.shuffle.partitions": 4,
                                       "spark.app.name": "theirs"},
                          app_name="pglogrepl-drain", driver_memory="2g")  # fmt: skip
    assert json.loads(text) == {
        "master": "local[2]",
        "conf": {"spark.sql.shuffle.partitions": "4", "spark.app.name": "pglogrepl-drain",
                 "spark.driver.memory": "2g"},
    }  # fmt: skip
    plain = json.loads(spark_settings("local", {}, app_name="a", driver_memory=None))
    assert plain["conf"] == {"spark.app.name": "a"}


def _module(tmp_path: Path, name: str, code: str) -> WorkerRun:
    (tmp_path / f"{name}.py").write_text(code)
    return WorkerRun(module=name, args=["one", "two"], env={**os.environ, "FROM_TASK": "yes"},
                     cwd=str(tmp_path))  # fmt: skip


def test_a_runs_lines_are_shown_and_kept_and_its_status_returned(tmp_path: Path) -> None:
    run = _module(tmp_path, "talker", (
        "import os, sys\n"
        "print('args', *sys.argv[1:])\n"
        "print('  env ' + os.environ['FROM_TASK'] + '  ')\n"
        "print('on stderr', file=sys.stderr)\n"
        "sys.exit(3)\n"
    ))  # fmt: skip
    shown: list[str] = []
    assert run.run(shown.append) == 3
    assert shown[0] == "args one two" and "  env yes  " in shown and "on stderr" in shown
    assert run.captured == [line.strip() for line in shown]


def test_a_kill_ends_the_run_and_what_it_started(tmp_path: Path) -> None:
    run = _module(tmp_path, "parent", (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    ))  # fmt: skip
    statuses: list[int] = []
    runner = threading.Thread(target=lambda: statuses.append(run.run(lambda line: None)))
    runner.start()
    try:
        wait_until(lambda: any(line.startswith("child ") for line in run.captured),
                   what="the run started its child")  # fmt: skip
        assert run.process is not None
        child = int(next(line for line in run.captured if line.startswith("child ")).split()[1])
        run.kill()
        runner.join(timeout=60)
        assert not runner.is_alive() and statuses and statuses[0] != 0
        assert run.process.poll() is not None

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            return _zombie(child)

        wait_until(gone, what="the run's own child ended too")
    finally:
        if run.process is not None and run.process.poll() is None:
            run.process.kill()


def _zombie(pid: int) -> bool:
    """Ended, waiting for its parent (the run's process, itself ended) to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def test_killing_a_run_that_never_started_or_already_ended_does_nothing(tmp_path: Path) -> None:
    run = _module(tmp_path, "quick", "print('done')\n")
    run.kill()  # not started
    assert run.run(lambda line: None) == 0
    run.kill()  # ended
    assert run.captured == ["done"]
