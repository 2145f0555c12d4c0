"""Running this package's Spark applications through spark-submit, safely.

``PackageSparkSubmitOperator`` is the base of the operators that submit an application of
``airflow_pglogrepl.spark`` (the drain, the snapshot). The Spark provider's hook runs
``spark-submit``; around it the base refuses a missing Spark connection (the provider would
silently submit to YARN) and any master or deploy mode that would put the source DSN on a command
line, hands the DSN to the application through its environment only (masked in the log), ships
this package to the executors as a ``--py-files`` zip, and keeps the application's output lines so
the operator can read its JSON summary back.

The task log is kept to what a reader needs: Spark's driver logs at ``spark_log_level`` (WARN by
default, ``spark.log4j``), the summary line is read, not logged, and an error the application
reported is raised once, as ours, without the provider's copy of the output around it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV, SUBMITTED_ENV
from airflow_pglogrepl.exceptions import SparkApplicationError
from airflow_pglogrepl.spark.submit_output import QuietSubmitOutput

PACKAGE_DIR = Path(__file__).resolve().parent.parent
DSN_ENV = SOURCE_DSN_ENV


def sink_asset(sink: str) -> Asset:
    """The Asset a sink is known by: its URI (``file://`` + absolute path for local paths)."""
    uri = sink if "://" in sink else f"file://{os.path.abspath(sink)}"
    return Asset(uri=uri)


class CapturingSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook that also keeps the application's output lines (for its JSON summary).

    The Spark provider has no public way to read the application's output: this overrides its
    private ``_process_spark_submit_log`` and keeps each line on the way through.
    tests/operators/test__spark.py pins what this relies on, so a provider upgrade
    that changes it fails there, not silently in a drain.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.captured: list[str] = []
        self.quiet: QuietSubmitOutput | None = None

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        def tee() -> Iterator[Any]:
            for line in itr:
                text = str(line).strip()
                self.captured.append(text)
                if summary_line([text], *SUMMARY_KEYS) is not None:
                    continue  # the summary is read, not logged
                if self.quiet is not None and not self.quiet.keep(text):
                    if (ivy := self.quiet.ivy_summary()) and not self.quiet.summarized:
                        self.quiet.summarized = True
                        self.log.info("%s", ivy)
                    continue
                yield line

        super()._process_spark_submit_log(tee())


# the keys one of the applications' JSON summary lines has (drain, snapshot, failure)
SUMMARY_KEYS = ("windows", "committed", "resolved", "error")


class PackageSparkSubmitOperator(TaskBoundary, SparkSubmitOperator):
    """SparkSubmitOperator for an application of this package, run with the source's DSN.

    Subclasses call ``_check_spark_connection()`` before anything reads the source's secrets,
    ``_prepare_submit(dsn)`` once, run ``_run_application(context)`` inside
    ``_shipping_package()`` and read the result with ``_summary(*keys)``.

    :param spark_log_level: the level of Spark's own (log4j) logging in the task log: ``WARN``
        by default; ``INFO`` or ``DEBUG`` for a run that needs Spark's account of itself.
    """

    def __init__(self, *, spark_log_level: str = "WARN", **kwargs: Any) -> None:
        from airflow_pglogrepl.spark.log4j import spark_log_level as log4j_level

        super().__init__(**kwargs)
        if "{{" not in str(spark_log_level):  # a typo fails the DAG's parse, not each try
            log4j_level(spark_log_level)
        self.spark_log_level = spark_log_level

    def _check_spark_connection(self) -> None:
        check_spark_connection(self._conn_id)

    def _prepare_submit(self, dsn: str) -> None:
        """The DSN into the spark-submit environment only (masked), and the Spark to run."""
        mask(dsn)
        self.env_vars = {
            **(self.env_vars or {}),
            DSN_ENV: dsn,
            SUBMITTED_ENV: "1",
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            **spark_home_env(),
        }
        if self._spark_binary is None:
            self._spark_binary = spark_submit_binary()
        self.conf = with_delta(self.conf or {}, user_jars=bool(self.jars or self.packages))

    @contextmanager
    def _shipping_package(self) -> Iterator[None]:
        """This package as ``--py-files``, and the driver's log configuration, while the block
        runs (both are removed after)."""
        from airflow_pglogrepl.spark.log4j import driver_env, spark_log_level

        level = spark_log_level(self.spark_log_level)
        with tempfile.TemporaryDirectory(prefix="pglogrepl-pyfiles-") as tmp:
            self.py_files = package_zip(Path(tmp))
            self.env_vars = driver_env(dict(self.env_vars or {}), Path(tmp), level)
            yield

    def _run_application(self, context: Context) -> None:
        """spark-submit the application. When it failed with an error it reported (its last
        output line names it), that error is raised here as ``SparkApplicationError``, retryable
        as the original: a lake from another server fails the task at once, a crash retries."""
        try:
            super().execute(context)
        except Exception:
            failure = self._summary("error")
            if failure is None:
                raise
            # The provider's exception repeats the command and the output's tail, which the
            # log above already has: the application's own error is the one to read.
            raise SparkApplicationError(
                str(failure["error"]),
                str(failure.get("message", "")),
                retryable=bool(failure.get("retryable", True)),
            ) from None

    def _summary(self, *keys: str) -> dict[str, Any] | None:
        """The last JSON summary line the application printed with one of ``keys``."""
        return summary_line(getattr(self._hook, "captured", []), *keys)

    def _get_hook(self) -> SparkSubmitHook:
        # The provider builds its hook from a dozen operator fields in its private _get_hook;
        # the capturing hook takes that hook's state as it is rather than repeat the list
        # (pinned by tests/operators/test__spark.py).
        from airflow_pglogrepl.spark.log4j import is_quiet, spark_log_level

        base = super()._get_hook()
        hook = CapturingSparkSubmitHook.__new__(CapturingSparkSubmitHook)
        hook.__dict__.update(base.__dict__)
        hook.captured = []
        quiet = is_quiet(spark_log_level(self.spark_log_level))
        hook.quiet = QuietSubmitOutput() if quiet else None
        return hook


def with_delta(conf: dict[str, Any], *, user_jars: bool = False) -> dict[str, Any]:
    """``conf`` plus what Delta Lake needs, without overriding anything the user set.

    The user's ``jars``/``packages`` (or ``spark.jars*`` in ``conf``) are taken to bring Delta
    themselves; otherwise ``PGLOGREPL_DELTA_JARS`` or Delta's Maven coordinates are added.
    """
    from airflow_pglogrepl.spark.session import delta_conf

    ours = delta_conf()
    if user_jars or any(k in conf for k in ("spark.jars", "spark.jars.packages")):
        ours = {k: v for k, v in ours.items() if not k.startswith("spark.jars")}
    return {**ours, **conf}


def summary_line(lines: Sequence[str], *keys: str) -> dict[str, Any] | None:
    """The last line of ``lines`` that is a JSON object with one of ``keys``, else None."""
    for line in reversed(lines):
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and any(key in value for key in keys):
                return value
    return None


def check_spark_connection(conn_id: str) -> None:
    """The Spark connection must exist and keep the DSN off command lines."""
    from airflow.sdk import BaseHook

    from airflow_pglogrepl.exceptions import SparkSetupError

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:
        raise SparkSetupError(
            f"Spark connection {conn_id!r} is not defined; without it the Spark "
            f"provider silently submits to YARN. Fix: define it, for local Spark e.g. "
            f'AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "spark", '
            f'"host": "local[*]"}}\', or a spark://host:7077 master'
        ) from None
    master = f"{conn.conn_type}://{conn.host or ''}"
    if "yarn" in master or "k8s" in master or conn.extra_dejson.get("deploy-mode") == "cluster":
        raise SparkSetupError(
            f"Spark connection {conn_id!r} ({master}) would pass the source DSN on the "
            f"spark-submit command line (YARN/Kubernetes/cluster mode turn environment "
            f"variables into --conf arguments). Use a local or standalone master in client "
            f"mode"
        )


def mask(secret: str) -> None:
    from airflow.sdk.log import mask_secret

    mask_secret(secret)


def spark_submit_binary() -> str:
    """``spark-submit`` from PATH, else the one pyspark installed next to this interpreter."""
    found = shutil.which("spark-submit")
    if found:
        return found
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    raise FileNotFoundError(
        "spark-submit is neither on PATH nor next to this Python; install the full 'pyspark' "
        "package (the Spark provider's pyspark-client has no spark-submit) or pass spark_binary"
    )


def spark_home_env() -> dict[str, str]:
    """``SPARK_HOME`` of the installed pyspark, unless the environment already sets one."""
    if os.environ.get("SPARK_HOME"):
        return {}
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return {}
    return {"SPARK_HOME": str(Path(spec.origin).parent)}


def package_zip(directory: Path) -> str:
    """This package as a zip for ``--py-files``: executors get the code without installing it."""
    target = directory / "airflow_pglogrepl.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in PACKAGE_DIR.rglob("*.py"):
            archive.write(path, path.relative_to(PACKAGE_DIR.parent))
    return str(target)
