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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV, SUBMITTED_ENV
from airflow_pglogrepl.exceptions import SparkApplicationError
from airflow_pglogrepl.operators.assets import lake_asset, lake_tables_alias
from airflow_pglogrepl.spark.submit_output import QuietSubmitOutput

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.storage import ObjectStore
    from airflow_pglogrepl.operators._in_worker import WorkerRun

PACKAGE_DIR = Path(__file__).resolve().parent.parent
DSN_ENV = SOURCE_DSN_ENV


def state_vectors_args(value: bool | None) -> list[str]:
    """The application's ``--[no-]state-deletion-vectors`` for an operator's
    ``state_deletion_vectors`` (None: no argument, the lake's recorded choice stands)."""
    if value is None:
        return []
    return ["--state-deletion-vectors" if value else "--no-state-deletion-vectors"]


class CapturingSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook that also keeps the application's output lines (for its JSON summary).

    The Spark provider has no public way to read the application's output: this overrides its
    private ``_process_spark_submit_log`` and keeps each line on the way through.
    tests/operators/test_spark_submit.py pins what this relies on, so a provider upgrade
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
                if shown(text, self.quiet, self.log.info):
                    yield line

        super()._process_spark_submit_log(tee())


def shown(text: str, quiet: QuietSubmitOutput | None, say: Callable[..., None]) -> bool:
    """Whether an output line of an application reaches the task log: its JSON summary is read,
    not logged, and at a quiet level what ``quiet`` holds back is not shown (Ivy's report
    becomes the one line ``say`` gets)."""
    if summary_line([text], *SUMMARY_KEYS) is not None:
        return False
    if quiet is not None and not quiet.keep(text):
        if (ivy := quiet.ivy_summary()) and not quiet.summarized:
            quiet.summarized = True
            say("%s", ivy)
        return False
    return True


# the keys one of the applications' JSON summary lines has (drain, snapshot, failure)
SUMMARY_KEYS = ("windows", "committed", "resolved", "error")


class PackageSparkSubmitOperator(TaskBoundary, SparkSubmitOperator):
    """SparkSubmitOperator for an application of this package that reads a slot's publications
    into a lake, run with the source's DSN.

    Subclasses call ``_check_spark_connection()`` before anything reads the source's secrets,
    ``_prepare_submit(dsn)`` once, run ``_run_application(context)`` inside
    ``_shipping_package()`` and read the result with ``_summary(*keys)``.

    :param spark_log_level: the level of Spark's own (log4j) logging in the task log: ``WARN``
        by default; ``INFO`` or ``DEBUG`` for a run that needs Spark's account of itself.
    :param lake_conn_id: the Airflow connection (type ``aws``) of the object store the lake is
        on (``hooks.object_store``); None: a local lake, or the store's defaults (``AWS_*``
        variables, the instance's role).
    """

    # The application's module when it can run without spark-submit on a local master
    # (``operators._in_worker``): the drain, which starts Spark only when a merge needs it.
    IN_WORKER_MODULE: str | None = None

    def __init__(self, *, postgres_conn_id: str, slot_name: str, publications: Sequence[str],
                 lake: str, spark_log_level: str = "WARN", lake_conn_id: str | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        from airflow_pglogrepl.spark.log4j import spark_log_level as log4j_level

        if "{{" not in lake:
            kwargs.setdefault("outlets", [lake_asset(lake), lake_tables_alias(lake)])
        kwargs.setdefault("outlets", [])
        super().__init__(**kwargs)
        self.postgres_conn_id = postgres_conn_id
        self.slot_name = slot_name
        self.publications = publications
        self.lake = lake
        self.lake_conn_id = lake_conn_id
        self._store: ObjectStore | None = None
        if "{{" not in str(spark_log_level):  # a typo fails the DAG's parse, not each try
            log4j_level(spark_log_level)
        self.spark_log_level = spark_log_level
        self._binary_given = self._spark_binary is not None
        self._master: str | None = None
        self._workdir: str | None = None
        self._worker_run: WorkerRun | None = None

    def _check_spark_connection(self) -> None:
        self._master = check_spark_connection(self._conn_id)

    def _use_lake_store(self, lake_root: str) -> None:
        """The lake's object store (``lake_conn_id``) for this process (the worker reads the
        lake before it submits) and for the application. Before anything else reads the lake:
        a lake with credentials in it is refused here."""
        from airflow_pglogrepl.hooks.object_store import check_bucket, lake_store
        from airflow_pglogrepl.lake import storage
        from airflow_pglogrepl.operators._in_worker import local_master

        store = lake_store(self.lake_conn_id, lake_root)
        if store is not None and store.access_key_id and not local_master(self._master):
            from airflow_pglogrepl.exceptions import LakeLocationError

            raise LakeLocationError(
                f"the lake's connection {self.lake_conn_id!r} gives keys, which reach Spark's "
                f"driver only (a private file on its machine): executors of master "
                f"{self._master} on other machines could not read or write the lake. Nothing "
                f"was started. Fix: give the executors the store's role (an instance profile, "
                f"IRSA, workload identity) and leave the keys out of the connection, or run on "
                f"a local master (docs/object-storage.md)"
            )
        if store is not None:
            check_bucket(store, lake_root)
        self._store = store
        storage.use(store)

    def _prepare_submit(self, dsn: str) -> None:
        """The DSN and the lake's store into the spark-submit environment only (masked), and the
        Spark to run."""
        from airflow_pglogrepl.hooks.base import mask  # psycopg, when the task runs
        from airflow_pglogrepl.lake.storage import STORE_ENV

        mask(dsn)
        store = {} if self._store is None else {STORE_ENV: self._store.to_json()}
        self.env_vars = {
            **(self.env_vars or {}),
            **store,
            DSN_ENV: dsn,
            SUBMITTED_ENV: "1",
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            **spark_home_env(),
        }
        if self._spark_binary is None:
            self._spark_binary = spark_submit_binary()
        self.conf = with_delta(self.conf or {}, user_jars=bool(self.jars or self.packages),
                               object_store=self._store is not None)  # fmt: skip

    @contextmanager
    def _shipping_package(self) -> Iterator[None]:
        """This package as ``--py-files``, and the driver's log configuration, while the block
        runs (both are removed after)."""
        from airflow_pglogrepl.spark.log4j import driver_env, spark_log_level

        level = spark_log_level(self.spark_log_level)
        with tempfile.TemporaryDirectory(prefix="pglogrepl-pyfiles-") as tmp:
            self.py_files = package_zip(Path(tmp))
            self.env_vars = driver_env(dict(self.env_vars or {}), Path(tmp), level)
            self._workdir = tmp
            try:
                yield
            finally:
                self._workdir = None

    def _run_application(self, context: Context) -> None:
        """spark-submit the application. When it failed with an error it reported (its last
        output line names it), that error is raised here as ``SparkApplicationError``, retryable
        as the original: a lake from another server fails the task at once, a crash retries.

        On a local master, an application that can (``IN_WORKER_MODULE``) runs without
        spark-submit: a plain Python process that starts Spark only if it needs it."""
        if self._runs_in_worker():
            self._run_in_worker()
            return
        try:
            super().execute(context)
        except Exception:
            reported = self._reported_error()
            if reported is None:
                raise
            # The provider's exception repeats the command and the output's tail, which the
            # log above already has: the application's own error is the one to read.
            raise reported from None

    def _reported_error(self) -> SparkApplicationError | None:
        """The error the application reported in its summary line, retryable as it said."""
        failure = self._summary("error")
        if failure is None:
            return None
        return SparkApplicationError(
            str(failure["error"]),
            str(failure.get("message", "")),
            retryable=bool(failure.get("retryable", True)),
        )

    def _runs_in_worker(self) -> bool:
        """A local master, an application that can, and no spark-submit binary asked for."""
        from airflow_pglogrepl.operators._in_worker import local_master

        return bool(self.IN_WORKER_MODULE) and not self._binary_given and local_master(self._master)

    def _run_in_worker(self) -> None:
        """The application as a child process of the worker, with what spark-submit would have
        been given: its environment (the DSN), its master and configuration (for the local
        session it starts when it must), its output shown and kept as spark-submit's is."""
        from airflow_pglogrepl.operators._in_worker import (
            SPARK_SETTINGS_ENV,
            WorkerRun,
            spark_settings,
        )
        from airflow_pglogrepl.spark.log4j import is_quiet, spark_log_level

        assert self.IN_WORKER_MODULE is not None and self._master is not None
        settings = spark_settings(self._master, self.conf or {}, app_name=str(self.name),
                                  driver_memory=self._driver_memory)  # fmt: skip
        env = {**os.environ, **(self.env_vars or {}), SPARK_SETTINGS_ENV: settings}
        quiet = QuietSubmitOutput() if is_quiet(spark_log_level(self.spark_log_level)) else None

        def show(line: str) -> None:
            if shown(line.strip(), quiet, self.log.info):
                self.log.info("%s", line)

        self.log.info(
            "Running %s on the worker without spark-submit (master %s): Spark starts only if "
            "a merge needs it", self.IN_WORKER_MODULE, self._master,
        )  # fmt: skip
        run = WorkerRun(self.IN_WORKER_MODULE, [str(a) for a in self.application_args or []],
                        env, cwd=self._workdir or tempfile.gettempdir())  # fmt: skip
        self._worker_run = run
        status = run.run(show)
        if status == 0:
            return
        reported = self._reported_error()
        if reported is not None:
            raise reported
        raise SparkApplicationError(
            f"exit status {status}",
            f"{self.IN_WORKER_MODULE} ended without reporting an error (killed, or out of "
            f"memory); its output is above",
            retryable=True,
        )

    def on_kill(self) -> None:
        if self._worker_run is not None:
            self._worker_run.kill()
            return
        super().on_kill()

    def _summary(self, *keys: str) -> dict[str, Any] | None:
        """The last JSON summary line the application printed with one of ``keys``."""
        if self._worker_run is not None:
            return summary_line(self._worker_run.captured, *keys)
        return summary_line(getattr(self._hook, "captured", []), *keys)

    def _get_hook(self) -> SparkSubmitHook:
        # The provider builds its hook from a dozen operator fields in its private _get_hook;
        # the capturing hook takes that hook's state as it is rather than repeat the list
        # (pinned by tests/operators/test_spark_submit.py).
        from airflow_pglogrepl.spark.log4j import is_quiet, spark_log_level

        base = super()._get_hook()
        hook = CapturingSparkSubmitHook.__new__(CapturingSparkSubmitHook)
        hook.__dict__.update(base.__dict__)
        hook.captured = []
        quiet = is_quiet(spark_log_level(self.spark_log_level))
        hook.quiet = QuietSubmitOutput() if quiet else None
        return hook


def with_delta(conf: dict[str, Any], *, user_jars: bool = False,
               object_store: bool = False) -> dict[str, Any]:  # fmt: skip
    """``conf`` plus what Delta Lake (and S3A, for a lake on an object store) needs, without
    overriding anything the user set.

    The user's ``jars``/``packages`` (or ``spark.jars*`` in ``conf``) are taken to bring Delta
    themselves; otherwise ``PGLOGREPL_DELTA_JARS`` or Delta's Maven coordinates are added.
    """
    from airflow_pglogrepl.spark.session import delta_conf

    ours = delta_conf(object_store=object_store)
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


def check_spark_connection(conn_id: str) -> str:
    """The Spark connection must exist and keep the DSN off command lines; its master."""
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
    if conn.extra_dejson.get("spark-binary"):
        return ""  # a spark-submit of the connection's choosing: always through it
    return str(conn.host or "")


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
