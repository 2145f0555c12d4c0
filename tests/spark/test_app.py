"""The process contract the Spark applications share (``spark.app``): the last line on stdout
is one JSON summary, whatever Spark, py4j or the run itself printed (sent to stderr); a failure
names its error class and retry decision there, carrying no secret of the DSN and no
kilobytes of JVM text; one of ours is told once (not at all under an operator, which raises it
from the summary), a foreign one with its traceback; no DSN exits 2 naming the operator that
sets it. Spark is started lazily: a run that never asks for it reports none."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV, SUBMITTED_ENV
from airflow_pglogrepl.spark.app import LazySpark, add_lake_argument, check_executors

DSN = "host=/nonexistent password=secret-pw"


def _app(body: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A program whose ``run(dsn)`` is ``body``, run under ``run_app`` in a process of its own
    (the contract moves file descriptor 1)."""
    program = (
        "from airflow_pglogrepl.spark.app import run_app\n"
        "from airflow_pglogrepl import exceptions\n"
        f"def run(dsn):\n    {body}\n"
        "raise SystemExit(run_app('test_app', 'TestOperator', run, logger='test'))\n"
    )
    base = {k: v for k, v in os.environ.items() if k not in (SOURCE_DSN_ENV, SUBMITTED_ENV)}
    return subprocess.run(
        [sys.executable, "-c", program], env={**base, SOURCE_DSN_ENV: DSN, **(env or {})},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _app_failing_with(error: str, *, prelude: str = "") -> subprocess.CompletedProcess[str]:
    program = (
        "from airflow_pglogrepl.spark.app import run_app\n"
        "from airflow_pglogrepl import exceptions\n"
        f"{prelude}"
        f"def run(dsn):\n    raise {error}\n"
        "raise SystemExit(run_app('test_app', 'TestOperator', run, logger='test'))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, SOURCE_DSN_ENV: "host=/nonexistent password=secret-pw"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_failed_application_names_its_error_and_retry_decision_last() -> None:
    lost = _app_failing_with("exceptions.SlotLostError('orders')")
    assert lost.returncode == 1, lost.stderr[-2000:]
    reported = json.loads(lost.stdout.strip().splitlines()[-1])
    assert reported["error"] == "SlotLostError" and reported["retryable"] is False
    assert "drop it and start again" in reported["message"]
    crashed = _app_failing_with("MemoryError('executor lost')")
    reported = json.loads(crashed.stdout.strip().splitlines()[-1])
    assert (reported["error"], reported["retryable"]) == ("MemoryError", True)
    assert "secret-pw" not in lost.stdout + lost.stderr + crashed.stdout + crashed.stderr


def test_an_applications_error_line_carries_no_secret_and_no_kilobytes() -> None:
    leaky = _app_failing_with("RuntimeError('java.sql.SQLException: secret-pw ' + 'x' * 50000)")
    reported = json.loads(leaky.stdout.strip().splitlines()[-1])
    assert "secret-pw" not in reported["message"] and len(reported["message"]) < 4200
    assert reported["message"].endswith("(cut; the application's log has it whole)")


def test_the_summary_is_the_only_line_on_stdout() -> None:
    done = _app("print('what Spark says'); import sys; sys.stdout.write('more\\n'); "
                "return {'windows': 2}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == '{"windows": 2}\n'
    assert "what Spark says" in done.stderr and "more" in done.stderr


def test_without_a_dsn_it_exits_2_naming_the_operator_that_sets_it() -> None:
    done = _app("return {}", env={SOURCE_DSN_ENV: ""})
    assert done.returncode == 2 and done.stdout == ""
    assert f"test_app: ${SOURCE_DSN_ENV} is not set" in done.stderr
    assert "(TestOperator sets it from the Airflow connection)" in done.stderr


def test_one_of_our_errors_is_told_once_with_its_cause_and_not_at_all_under_an_operator() -> None:
    body = ("try:\n        raise ValueError('the server said no')\n    except ValueError as e:\n"
            "        raise exceptions.SlotLostError('orders') from e")  # fmt: skip
    alone = _app(body)
    assert alone.returncode == 1
    assert alone.stderr.count("test_app: SlotLostError:") == 1
    assert "the cause of SlotLostError: ValueError: the server said no" in alone.stderr
    assert "Traceback" not in alone.stderr  # ours carries its fix; no traceback to read
    submitted = _app(body, env={SUBMITTED_ENV: "1"})
    assert "test_app: SlotLostError:" not in submitted.stderr  # the operator raises it
    assert json.loads(submitted.stdout)["error"] == "SlotLostError"


def test_a_foreign_error_is_logged_with_its_traceback() -> None:
    crashed = _app("raise KeyError('lost')")
    assert crashed.returncode == 1
    assert "test_app failed" in crashed.stderr and "Traceback" in crashed.stderr
    assert "KeyError: 'lost'" in crashed.stderr


def test_spark_that_was_never_asked_for_is_reported_as_not_started() -> None:
    lazy = LazySpark("unused")
    assert lazy.summary() == {"spark_start_s": None}
    lazy.stop()  # nothing to stop
    assert lazy.summary() == {"spark_start_s": None} and lazy.executors == []


def test_a_local_master_is_not_probed_for_executors() -> None:
    """Local masters share the driver's installation: no job is run to check them."""

    def no_job(*args: object) -> None:
        raise AssertionError("a Spark job was run")

    for master in ("local", "local[4]", "local[*]"):
        context = SimpleNamespace(master=master, parallelize=no_job, defaultParallelism=4)
        assert check_executors(SimpleNamespace(sparkContext=context)) == []


def test_a_cluster_whose_executors_cannot_import_the_package_is_refused_with_the_fix() -> None:
    from airflow_pglogrepl.exceptions import SparkSetupError

    def failing_job(*args: object) -> None:
        raise RuntimeError("ModuleNotFoundError: No module named 'airflow_pglogrepl'")

    context = SimpleNamespace(master="spark://cluster:7077", parallelize=failing_job,
                              defaultParallelism=2)  # fmt: skip
    with pytest.raises(SparkSetupError, match=r"executors of spark://cluster:7077 cannot import "
                       r"airflow_pglogrepl \(RuntimeError\)\. Fix: ship the package"):  # fmt: skip
        check_executors(SimpleNamespace(sparkContext=context))


def test_the_lake_is_required() -> None:
    parser = argparse.ArgumentParser()
    add_lake_argument(parser, writes="Delta")
    assert parser.parse_args(["--lake", "/a"]).lake_root == "/a"
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_sigterm_ends_an_application_through_its_finally_blocks(tmp_path: object) -> None:
    """A SIGTERM (``on_kill``, a worker's shutdown) would kill the process where it stands,
    leaving a snapshot's passfile (the password) on disk; it exits 143 through ``finally``."""
    import pathlib

    secret = pathlib.Path(str(tmp_path)) / "pgpass"
    body = (
        f"import os, signal, time, pathlib; p = pathlib.Path({str(secret)!r}); p.write_text('x')\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)\n"
        "    finally:\n"
        "        p.unlink()"
    )
    done = _app(body)
    assert done.returncode == 143, done.stderr[-2000:]
    assert not secret.exists()


def test_an_applications_error_line_carries_no_secret_of_the_lakes_store() -> None:
    """Review finding: an S3 error repeats an expired session token; a foreign error carrying it
    reached the summary line (only the DSN's secrets were removed there)."""
    store = (
        "from airflow_pglogrepl.lake import storage\n"
        "storage.use(storage.ObjectStore(secret_access_key='s3-secret', session_token='tok-123'))\n"
    )
    leaky = _app_failing_with(
        "RuntimeError('ExpiredToken <Token-0>tok-123</Token-0> s3-secret')", prelude=store
    )
    reported = json.loads(leaky.stdout.strip().splitlines()[-1])
    assert "tok-123" not in reported["message"] and "s3-secret" not in reported["message"]
