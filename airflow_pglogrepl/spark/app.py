"""The process contract the Spark applications (``drain_app``, ``snapshot_app``) share.

Both run under ``spark-submit`` or ``python -m``, read the source only from
``PGLOGREPL_SOURCE_DSN`` (never argv, which ``ps`` and the Spark UI show), and talk to the
operator that launched them through stdout: the last line is one JSON summary. Spark, py4j and
Airflow's logging all write to stdout too, some of it at interpreter exit, so everything but the
summary is sent to stderr and the summary goes to the saved real stdout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.exceptions import SparkSetupError

DSN_ENV = SOURCE_DSN_ENV


def non_negative_int(text: str) -> int:
    """An argument that is a whole number, 0 or more (argparse's ``type``)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return value


def add_lake_argument(parser: Any, *, writes: str) -> None:
    """``--lake``, the lake root."""
    parser.add_argument(
        "--lake",
        dest="lake_root",
        required=True,
        help=f"lake root: a path or a URI {writes} writes",
    )


def add_state_vectors_argument(parser: Any) -> None:
    """``--[no-]state-deletion-vectors``: how the lake creates its state tables, recorded in the
    lake so later runs follow it (``Lake.claim``); absent, the lake's recorded choice (on for a
    new lake)."""
    import argparse

    parser.add_argument(
        "--state-deletion-vectors", action=argparse.BooleanOptionalAction, default=None,
        help="create state tables with deletion vectors (default: as the lake records, on for "
        "a new lake); --no-state-deletion-vectors for readers without them (to_pandas)",
    )  # fmt: skip


def spark_session(app_name: str) -> Any:
    """The session spark-submit prepared (its master); under ``python -m``, the one the operator
    described (``SPARK_SETTINGS_ENV``: a local master run without spark-submit), else a local
    one."""
    from airflow_pglogrepl.spark.session import (
        SPARK_SETTINGS_ENV,
        configure,
        local_session,
        session_with,
    )

    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit
        from pyspark.sql import SparkSession

        return configure(SparkSession.builder.appName(app_name)).getOrCreate()
    described = os.environ.get(SPARK_SETTINGS_ENV)
    if described:
        settings = json.loads(described)
        return session_with(app_name, str(settings["master"]), dict(settings["conf"]))
    return local_session(app_name, cores=os.cpu_count() or 2)


class LazySpark:
    """The application's Spark session, started on first use.

    The drain's changelog needs no JVM (pyarrow writes its files and delta-rs commits them):
    Spark starts only for the merge into ``state/``, so a run that fails its checks, crashes
    mid-window or runs with ``--no-materialize`` pays nothing for it. A snapshot starts it only
    for a table it copies on Spark (``spark.snapshot_engine``), before its slot exists. Tables
    are copied on threads: the first to ask starts it, the others wait for that one.
    """

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self._lock = threading.Lock()
        self._session: Any = None
        self.started_s: float | None = None
        self.executors: list[dict[str, Any]] = []

    def get(self) -> Any:
        with self._lock:
            return self._started()

    def _started(self) -> Any:
        if self._session is None:
            began = time.monotonic()
            self._session = spark_session(self.app_name)
            self.started_s = round(time.monotonic() - began, 3)
            self.executors = check_executors(self._session)
        return self._session

    def summary(self) -> dict[str, Any]:
        """What the run's JSON summary says of Spark: its start-up time, master and executors
        (``spark_start_s`` None: it never started)."""
        if self._session is None:
            return {"spark_start_s": None}
        return {
            "spark_start_s": self.started_s,
            "master": str(self._session.sparkContext.master),
            "executors": self.executors,
        }

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None


def check_executors(spark: Any) -> list[dict[str, Any]]:
    """On a cluster master, make sure executors can import this package (fail early if not).

    Executors are separate processes, possibly on other machines, that do not have the package
    installed: spark-submit must ship it (``--py-files``; the operators do). Finding out at
    start-up with a clear message beats an ImportError deep in a job. Local masters share the
    driver's installation and are not checked.
    """
    master = str(spark.sparkContext.master)
    if master.startswith("local"):
        return []
    slots = max(2, int(spark.sparkContext.defaultParallelism))
    try:
        found = spark.sparkContext.parallelize(range(slots), slots).map(_executor_probe).collect()
    except Exception as exc:
        raise SparkSetupError(
            f"Spark executors of {master} cannot import airflow_pglogrepl "
            f"({exc.__class__.__name__}). Fix: ship the package with spark-submit --py-files "
            f"(the operators build the zip themselves) or install it on every worker"
        ) from None
    unique = {(p["host"], p["pid"]): p for p in found}
    for probe in unique.values():
        logging.getLogger("airflow_pglogrepl.spark").info(
            "executor %s pid %s imports airflow_pglogrepl from %s",
            probe["host"], probe["pid"], probe["package"],
        )  # fmt: skip
    return list(unique.values())


def _executor_probe(_: int) -> dict[str, Any]:
    import socket

    import airflow_pglogrepl.pgoutput

    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "package": os.path.dirname(airflow_pglogrepl.pgoutput.__file__),
    }


# A JVM error's text can run to tens of kilobytes; the task's failure needs its head.
_MESSAGE_CHARS = 4000


def _reportable(message: str, dsn: str) -> str:
    """``message`` fit for the task's failure, which reaches notifications that no log masker
    sees: any secret of the DSN or of the lake's store removed (ours never carry one; a foreign
    error might: an S3 error repeats an expired session token), cut short."""
    from airflow_pglogrepl.conninfo import redact, secrets_of
    from airflow_pglogrepl.lake import storage
    from airflow_pglogrepl.postgres.connect import dsn_params

    store = storage.current()
    if store is not None:
        message = redact(message, store.secrets())
    with contextlib.suppress(Exception):  # an unparsable DSN failed earlier, and said so
        message = redact(message, secrets_of(dsn_params(dsn)))
    if len(message) > _MESSAGE_CHARS:
        message = message[:_MESSAGE_CHARS] + " ... (cut; the application's log has it whole)"
    return message


def _report(prog: str, exc: Exception, *, logger: str) -> None:
    """The failure on stderr, once. One of ours carries its fix and needs no traceback; under an
    operator (``SUBMITTED_ENV``) it is not printed at all, since the operator raises it from the
    summary line. A foreign error gets its traceback, which is what there is to read."""
    from airflow_pglogrepl.conninfo import SUBMITTED_ENV
    from airflow_pglogrepl.exceptions import PgLogReplError

    if not isinstance(exc, PgLogReplError):
        logging.getLogger(logger).exception("%s failed", prog)
        return
    if not os.environ.get(SUBMITTED_ENV):
        print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
    cause = exc.__cause__
    if cause is not None:  # the server's own words, which the error's message does not repeat
        logging.getLogger(logger).info(
            "%s: the cause of %s: %s: %s", prog, type(exc).__name__, type(cause).__name__,
            str(cause).strip(),
        )  # fmt: skip


def run_app(prog: str, operator: str, run: Callable[[str], dict[str, Any]], *, logger: str) -> int:
    """Run ``run(dsn)`` under the contract; the exit status (0, 1 failed, 2 no DSN)."""
    sys.stdout.flush()
    summary_fd = os.dup(1)
    os.dup2(2, 1)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per gateway call at INFO
    # pyspark warns of pandas 3 on import; the applications use pandas through Arrow only
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from airflow_pglogrepl.lake.storage import exit_on_sigterm

    exit_on_sigterm()  # (a following drain installs its own: stop after the window in hand)
    dsn = os.environ.get(DSN_ENV)
    if not dsn:
        print(
            f"{prog}: ${DSN_ENV} is not set; it must hold the source's libpq conninfo or URI "
            f"({operator} sets it from the Airflow connection)",
            file=sys.stderr,
        )
        return 2
    try:
        result = run(dsn)
    except Exception as exc:
        _report(prog, exc, logger=logger)
        # what failed, for the operator: it raises it again as SparkApplicationError, and the
        # task boundary decides about retries as it would had the error been raised there
        result = {
            "error": type(exc).__name__,
            "message": _reportable(str(exc), dsn),
            "retryable": bool(getattr(exc, "retryable", True)),
        }
        status = 1
    else:
        status = 0
    os.write(summary_fd, (json.dumps(result) + "\n").encode())
    os.close(summary_fd)
    return status
