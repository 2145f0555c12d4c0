"""The driver's log configuration: quiet by default, a clear error for a level log4j does not
know, the user's own options kept after ours, and paths with spaces still one option."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from airflow_pglogrepl.spark import log4j


@pytest.mark.parametrize(("given", "level"), [("warn", "WARN"), (" Warning ", "WARN"),
                                              ("debug", "DEBUG"), ("OFF", "OFF")])  # fmt: skip
def test_a_level_as_a_dag_author_writes_it(given: str, level: str) -> None:
    assert log4j.spark_log_level(given) == level


def test_an_unknown_level_says_which_exist() -> None:
    with pytest.raises(ValueError, match=r"'verbose' is not a log4j level; use one of OFF, "):
        log4j.spark_log_level("verbose")


def test_quiet_levels_hide_what_no_one_can_act_on() -> None:
    quiet, loud = log4j.properties("WARN"), log4j.properties("INFO")
    assert "rootLogger.level = WARN" in quiet and "NativeCodeLoader" in quiet
    assert "rootLogger.level = INFO" in loud and "NativeCodeLoader" not in loud
    assert log4j.is_quiet("ERROR") and not log4j.is_quiet("DEBUG")


def test_the_drivers_options_put_ours_first_and_keep_the_users(tmp_path: Path) -> None:
    folder = tmp_path / "a folder with spaces"
    folder.mkdir()
    env = log4j.driver_env({log4j.SUBMIT_OPTS_ENV: "-Dtheirs=1", "OTHER": "x"}, folder, "WARN")
    options = shlex.split(env[log4j.SUBMIT_OPTS_ENV])  # as the launcher splits them
    written = folder / "log4j2-pglogrepl.properties"
    assert options == [f"-Dlog4j2.configurationFile=file:{written}", "-Dtheirs=1"]
    assert written.read_text() == log4j.properties("WARN") and env["OTHER"] == "x"
