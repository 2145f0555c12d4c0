"""The drain application's command line and its process contract, without a JVM: the arguments
the operator builds parse to what the drain is given (defaults, several publications, the state
tables' deletion vectors left to the lake unless said), a wrong argument is refused by argparse,
a run without the source's DSN exits 2 naming the variable and the operator that sets it, and a
slot that does not exist is refused before the lake is touched or Spark started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.spark.drain_app import parse_args
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.paths import REPO

REQUIRED = ["--slot", "s", "--publication", "p", "--lake", "/l"]


def test_the_defaults_are_the_drains() -> None:
    args = parse_args(REQUIRED)
    assert (args.slot, args.publication, args.lake_root) == ("s", ["p"], "/l")
    assert args.max_window_bytes == 64 * 1024 * 1024 and args.max_windows is None
    assert args.batch_rows == 200_000 and args.merge_parallelism == 4
    assert args.small_merge_rows == 100_000
    assert not args.no_materialize and not args.accept_source_change
    assert args.on_quarantine == "fail"
    assert args.state_deletion_vectors is None  # the lake's recorded choice


def test_publications_add_up_and_every_setting_is_taken() -> None:
    args = parse_args([
        "--slot", "s", "--publication", "a", "b", "--lake", "s3://b/l", "--publication", "c",
        "--max-window-bytes", "1024", "--max-windows", "3", "--no-materialize",
        "--batch-rows", "10", "--merge-parallelism", "2", "--small-merge-rows", "0",
        "--accept-source-change", "--on-quarantine", "warn", "--no-state-deletion-vectors",
    ])  # fmt: skip
    assert args.publication == ["a", "b", "c"] and args.lake_root == "s3://b/l"
    assert (args.max_window_bytes, args.max_windows, args.batch_rows) == (1024, 3, 10)
    assert (args.merge_parallelism, args.small_merge_rows) == (2, 0)
    assert args.no_materialize and args.accept_source_change
    assert args.on_quarantine == "warn" and args.state_deletion_vectors is False
    assert parse_args([*REQUIRED, "--state-deletion-vectors"]).state_deletion_vectors is True


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--publication", "p", "--lake", "/l"], "the following arguments are required: --slot"),
        (["--slot", "s", "--lake", "/l"], "required: --publication"),
        (["--slot", "s", "--publication", "p"], "required: --lake"),
        ([*REQUIRED, "--on-quarantine", "skip"], "invalid choice: 'skip'"),
        ([*REQUIRED, "--max-window-bytes", "64MB"], "invalid int value: '64MB'"),
    ],
)
def test_a_wrong_command_line_is_refused_naming_the_argument(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        parse_args(argv)
    assert refused.value.code == 2 and said in capsys.readouterr().err


def _drain_app(*args: str, dsn: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != DSN_ENV}
    env["PYTHONPATH"] = str(REPO)
    if dsn is not None:
        env[DSN_ENV] = dsn
    return subprocess.run(
        [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_without_the_sources_dsn_it_exits_2_naming_the_variable(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    done = _drain_app("--slot", "s", "--publication", "p", "--lake", str(lake), dsn=None)
    assert done.returncode == 2, done.stderr
    assert f"${DSN_ENV} is not set" in done.stderr and "SlotDrainOperator sets it" in done.stderr
    assert done.stdout == "" and not lake.exists()


def test_a_slot_that_does_not_exist_is_refused_before_the_lake_or_spark(
    publisher: PgCluster, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    done = _drain_app("--slot", "no_such_drain_slot", "--publication", "p", "--lake", str(lake),
                      dsn=publisher.dsn())  # fmt: skip
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])  # the last line: the summary
    assert summary["error"] == "SlotNotFoundError" and summary["retryable"] is False, summary
    assert "no_such_drain_slot" in summary["message"]
    assert not lake.exists()
    assert "spark" not in done.stderr.lower()  # no session was started
