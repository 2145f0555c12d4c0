"""spark-submit's own output at a quiet log level: Ivy's routine report becomes one line, what
is not routine (an unresolved module) and the application's lines pass through."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.spark.log4j import driver_env, is_quiet, properties, spark_log_level
from airflow_pglogrepl.spark.submit_output import QuietSubmitOutput

pytestmark = pytest.mark.unit

# spark-submit with spark.jars.packages (Delta), cut to a few lines of each kind
IVY_REPORT = """WARNING: Using incubator modules: jdk.incubator.vector
:: loading settings :: url = jar:file:/opt/venv/pyspark/jars/ivy-2.5.3.jar!/ivysettings.xml
Ivy Default Cache set to: /home/airflow/.ivy2.5.2/cache
The jars for the packages stored in: /home/airflow/.ivy2.5.2/jars
io.delta#delta-spark_4.2_2.13 added as a dependency
io.delta#delta-storage added as a dependency
:: resolving dependencies :: org.apache.spark#spark-submit-parent-3cd04716;1.0
	confs: [default]
	found io.delta#delta-spark_4.2_2.13;4.4.0 in central
	found io.delta#delta-storage;4.4.0 in central
	found io.delta#delta-kernel-unitycatalog;4.4.0 in central
:: resolution report :: resolve 2269ms :: artifacts dl 65ms
	:: modules in use:
	com.fasterxml.jackson.core#jackson-annotations;2.13.5 from central in [default]
	com.fasterxml.jackson.core#jackson-core;2.13.5 from central in [default]
	org.xerial.snappy#snappy-java;1.1.10.7 from central in [default]
	:: evicted modules:
	org.xerial.snappy#snappy-java;1.1.10.4 by [org.xerial.snappy#snappy-java;1.1.10.7] in [default]
	---------------------------------------------------------------------
	|                  |            modules            ||   artifacts   |
	|       conf       | number| search|dwnlded|evicted|| number|dwnlded|
	---------------------------------------------------------------------
	|      default     |   37  |   0   |   0   |   4   ||   33  |   0   |
	---------------------------------------------------------------------
:: retrieving :: org.apache.spark#spark-submit-parent-3cd04716
	confs: [default]
	0 artifacts copied, 33 already retrieved (0kB/9ms)
"""

UNRESOLVED = """\
:: loading settings :: url = jar:file:/opt/venv/pyspark/jars/ivy-2.5.3.jar!/ivysettings.xml
Ivy Default Cache set to: /home/airflow/.ivy2.5.2/cache
:: resolving dependencies :: org.apache.spark#spark-submit-parent-1;1.0
\tconfs: [default]
\t:: module not found: io.delta#delta-spark_4.2_2.13;9.9.9
\t\t::::::::::::::::::::::::::::::::::::::::::::::
\t\t::          UNRESOLVED DEPENDENCIES         ::
Exception in thread "main" java.lang.RuntimeException: [unresolved dependency: io.delta#x]
"""


def test_ivys_routine_report_is_held_back_and_summed_up_in_one_line() -> None:
    quiet = QuietSubmitOutput()
    lines = [*IVY_REPORT.splitlines(), "2026-11-26 06:07:30,369 INFO window 0/1..0/2: 3 changes"]
    kept = [line for line in lines if quiet.keep(line)]
    assert kept == ["2026-11-26 06:07:30,369 INFO window 0/1..0/2: 3 changes"]
    summary = quiet.ivy_summary()
    assert summary is not None and "33 jars, 0 downloaded" in summary
    assert "PGLOGREPL_DELTA_JARS" in summary


def test_what_is_not_routine_in_ivys_output_passes() -> None:
    quiet = QuietSubmitOutput()
    kept = [line for line in UNRESOLVED.splitlines() if quiet.keep(line)]
    assert any("module not found" in line for line in kept)
    assert any("UNRESOLVED DEPENDENCIES" in line for line in kept)
    assert kept[-1].startswith("Exception in thread")
    assert quiet.ivy_summary() is None  # it never finished


def test_table_like_lines_outside_ivys_report_pass() -> None:
    quiet = QuietSubmitOutput()
    assert quiet.keep("-----") and quiet.keep("| a | b |")


def test_log_levels() -> None:
    assert spark_log_level("warning") == "WARN" and spark_log_level(" info ") == "INFO"
    with pytest.raises(ValueError, match="not a log4j level"):
        spark_log_level("LOUD")
    assert is_quiet("WARN") and is_quiet("ERROR") and not is_quiet("INFO")
    assert "rootLogger.level = INFO" in properties("INFO")
    assert "NativeCodeLoader" in properties("WARN") and "NativeCodeLoader" not in properties("INFO")


def test_the_users_driver_options_are_kept_after_ours(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Dfrom.environment=1")
    env = driver_env({"PGLOGREPL_SOURCE_DSN": "x"}, Path(str(tmp_path)), "WARN")
    options = env["SPARK_SUBMIT_OPTS"]
    assert env["PGLOGREPL_SOURCE_DSN"] == "x"
    assert options.startswith("-Dlog4j2.configurationFile=file:")
    assert options.endswith(" -Dfrom.environment=1")
    given = driver_env({"SPARK_SUBMIT_OPTS": "-Dx=1"}, Path(str(tmp_path)), "WARN")
    assert given["SPARK_SUBMIT_OPTS"].endswith(" -Dx=1")
    spaced = Path(str(tmp_path)) / "a b"
    spaced.mkdir()
    quoted = driver_env({}, spaced, "WARN")["SPARK_SUBMIT_OPTS"]
    assert quoted.startswith('"-Dlog4j2') and quoted.endswith('properties" -Dfrom.environment=1')
