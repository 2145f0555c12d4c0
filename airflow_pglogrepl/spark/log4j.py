"""The log configuration of the spark-submit driver our operators start: quiet unless asked.

Every line spark-submit prints becomes a line of the Airflow task log (the Spark provider logs
them one by one). At Spark's default level a small drain writes a thousand lines of scheduler and
codec chatter around the dozen lines that say what the run did. The operators therefore hand the
driver JVM a log4j2 configuration (``-Dlog4j2.configurationFile`` in ``SPARK_SUBMIT_OPTS``) at
``WARN`` by default; a ``spark_log_level`` argument raises it for a run that needs Spark's own
account. The application's own progress lines are Python logging, not log4j, and are not
affected.

Warnings a run prints and no user can act on are kept at ``ERROR``: the missing native Hadoop
library, the loopback host name (local mode binds to loopback on purpose) and a plan's text cut
short in a debug string. They still appear at ``INFO`` and below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
DEFAULT_LEVEL = "WARN"
SUBMIT_OPTS_ENV = "SPARK_SUBMIT_OPTS"

# logger -> the level below which its known, unactionable warnings are not shown
_UNACTIONABLE = {
    "org.apache.hadoop.util.NativeCodeLoader": "ERROR",
    "org.apache.spark.util.Utils": "ERROR",
    # "Truncated the string representation of a plan": a debugging aid's length, not a problem
    "org.apache.spark.sql.catalyst.util.SparkStringUtils": "ERROR",
}


def spark_log_level(value: object) -> str:
    """``value`` as a log4j level name; a clear error for anything else (a templated argument
    arrives as text)."""
    level = str(value).strip().upper()
    if level == "WARNING":
        level = "WARN"
    if level not in LEVELS:
        raise ValueError(
            f"spark_log_level {value!r} is not a log4j level; use one of {', '.join(LEVELS)}"
        )
    return level


def is_quiet(level: str) -> bool:
    """Whether ``level`` hides Spark's INFO lines (and so Ivy's report, ``submit_output``)."""
    return LEVELS.index(level) < LEVELS.index("INFO")


def properties(level: str) -> str:
    """A log4j2 properties file: everything at ``level`` to stderr, in Spark's own line format."""
    lines = [
        f"rootLogger.level = {level}",
        "rootLogger.appenderRef.stderr.ref = console",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
    ]
    if is_quiet(level):
        for n, (logger, quiet) in enumerate(sorted(_UNACTIONABLE.items())):
            lines += [f"logger.q{n}.name = {logger}", f"logger.q{n}.level = {quiet}"]
    return "\n".join(lines) + "\n"


def driver_env(env: Mapping[str, str], directory: Path, level: str) -> dict[str, str]:
    """``env`` (spark-submit's environment) with the driver's JVM reading a configuration at
    ``level`` written into ``directory``.

    The option goes in ``SPARK_SUBMIT_OPTS``, which the launcher puts on the driver's command
    line before ``spark.driver.defaultJavaOptions`` and ``spark.driver.extraJavaOptions``: a
    ``-Dlog4j2.configurationFile`` of the user's, in their conf or spark-defaults.conf, wins, and
    nothing of spark-defaults.conf is replaced (a ``--conf spark.driver.extraJavaOptions`` would
    replace its value). Any ``SPARK_SUBMIT_OPTS`` already set is kept, after ours."""
    path = directory / "log4j2-pglogrepl.properties"
    path.write_text(properties(level))
    ours = f"-Dlog4j2.configurationFile=file:{path}"
    if any(c.isspace() for c in ours):
        ours = f'"{ours}"'  # the launcher splits the options as a shell would
    theirs = env.get(SUBMIT_OPTS_ENV, os.environ.get(SUBMIT_OPTS_ENV, "")).strip()
    return {**env, SUBMIT_OPTS_ENV: f"{ours} {theirs}".strip()}
