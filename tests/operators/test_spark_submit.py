"""What the drain's spark-submit relies on in the Spark provider's private code, pinned.

The provider offers no public way to read the application's output (the drain's JSON summary
line), so ``CapturingSparkSubmitHook`` overrides ``_process_spark_submit_log`` and
``PackageSparkSubmitOperator._get_hook`` takes the provider's hook state over. An upgrade that
renames or reshapes either fails here, before a drain loses its summary.

``with_delta``: the operators make Delta Lake available to Spark without overriding the user.
"""

from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_pglogrepl.operators.spark_submit import (
    CapturingSparkSubmitHook,
    PackageSparkSubmitOperator,
    with_delta,
)
from airflow_pglogrepl.spark.session import DELTA_PACKAGES, JARS_ENV


def test_the_provider_still_has_the_private_methods_we_override() -> None:
    method = SparkSubmitHook.__dict__.get("_process_spark_submit_log")
    assert method is not None, "SparkSubmitHook._process_spark_submit_log is gone"
    assert list(inspect.signature(method).parameters) == ["self", "itr"]
    assert "_get_hook" in SparkSubmitOperator.__dict__, "SparkSubmitOperator._get_hook is gone"
    # the state is copied through __dict__: a hook with __slots__ would lose it
    assert not hasattr(SparkSubmitHook, "__slots__")


# what every lake operator is given: the slot, its publications, the lake
LAKE_TASK: dict[str, Any] = {"postgres_conn_id": "pg", "slot_name": "s", "publications": ["p"],
                             "lake": "/lake"}  # fmt: skip


def test_the_capturing_hook_keeps_the_lines_and_the_providers_state() -> None:
    operator = PackageSparkSubmitOperator(
        task_id="t", application="app.py", conn_id="spark_local", name="pinned", verbose=True,
        **LAKE_TASK,
    )  # fmt: skip
    base = SparkSubmitOperator._get_hook(operator)
    hook = operator._get_hook()
    assert isinstance(hook, CapturingSparkSubmitHook)
    # every field the provider set, with the same value (its logger proxy is built per hook)
    ours = {k: v for k, v in vars(hook).items() if k not in ("captured", "quiet", "_log")}
    assert ours == {k: v for k, v in vars(base).items() if k != "_log"}
    assert set(vars(hook)) == set(vars(base)) | {"captured", "quiet"}
    hook._process_spark_submit_log(iter(['{"windows": 1}\n', "plain line\n"]))
    assert hook.captured == ['{"windows": 1}', "plain line"]


def test_the_users_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JARS_ENV, raising=False)
    mine = {"spark.sql.extensions": "my.Extension", "spark.executor.memory": "2g"}
    conf = with_delta(mine)
    assert conf["spark.sql.extensions"] == "my.Extension" and conf["spark.executor.memory"] == "2g"
    assert conf["spark.jars.packages"] == ",".join(DELTA_PACKAGES)
    # jars of their own (operator argument or configuration): ours are not added
    assert "spark.jars.packages" not in with_delta({}, user_jars=True)
    assert with_delta({"spark.jars": "/opt/delta.jar"})["spark.jars"] == "/opt/delta.jar"
    assert "spark.jars.packages" not in with_delta({"spark.jars": "/opt/delta.jar"})


@pytest.mark.spark  # spark-submit's launcher starts a JVM (--version)
def test_the_drivers_log_configuration_keeps_the_users_spark_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Java options of spark-defaults.conf (a trust store, a proxy, a log configuration of
    their own) reach the driver JVM beside ours: a spark.driver.extraJavaOptions on the command
    line would replace them. Read from the JVM command spark-submit's launcher builds."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[1]"}')
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions -Dpglogrepl.probe=defaults "
        "-Dlog4j2.configurationFile=file:/etc/theirs.properties\n"
    )
    operator = PackageSparkSubmitOperator(
        task_id="t", application="app.py", conn_id="spark_local", spark_log_level="ERROR",
        **LAKE_TASK,
    )  # fmt: skip
    operator._prepare_submit("host=localhost dbname=probe")
    with operator._shipping_package():
        hook = operator._get_hook()
        command = [*hook._build_spark_submit_command("app.py")[:-1], "--version"]
        env = {**os.environ, **(hook._env or {}), "SPARK_CONF_DIR": str(conf_dir),
               "SPARK_PRINT_LAUNCH_COMMAND": "1"}  # fmt: skip
        ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert "spark.driver.extraJavaOptions" not in (operator.conf or {})
    launched = next(line for line in ran.stderr.splitlines() if line.startswith("Spark Command"))
    options = [word for word in launched.split() if word.startswith("-D")]
    assert "-Dpglogrepl.probe=defaults" in options, launched
    # ours first, so a configuration file of theirs wins
    logs = [o for o in options if o.startswith("-Dlog4j2.configurationFile=")]
    assert logs[-1] == "-Dlog4j2.configurationFile=file:/etc/theirs.properties", logs
    assert len(logs) == 2 and "log4j2-pglogrepl" in logs[0], logs


def test_a_misspelt_spark_log_level_fails_the_dags_parse() -> None:
    """Not each try of the task: a ValueError at run time is retried like a network fault."""
    with pytest.raises(ValueError, match="not a log4j level"):
        PackageSparkSubmitOperator(task_id="t", application="a.py", spark_log_level="WARNN",
                                   **LAKE_TASK)  # fmt: skip
    templated = "{{ params.spark_log_level }}"
    operator = PackageSparkSubmitOperator(task_id="t", application="a.py",
                                          spark_log_level=templated, **LAKE_TASK)  # fmt: skip
    assert operator.spark_log_level == templated  # checked once rendered, when the task runs
