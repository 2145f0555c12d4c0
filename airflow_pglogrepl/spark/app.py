"""The process contract the Spark applications (``drain_app``, ``snapshot_app``) share.

Both run under ``spark-submit`` or ``python -m``, read the source only from
``PGLOGREPL_SOURCE_DSN`` (never argv, which ``ps`` and the Spark UI show), and talk to the
operator that launched them through stdout: the last line is one JSON summary. Spark, py4j and
Airflow's logging all write to stdout too, some of it at interpreter exit, so everything but the
summary is sent to stderr and the summary goes to the saved real stdout.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV

DSN_ENV = SOURCE_DSN_ENV


def spark_session(app_name: str) -> Any:
    """The session spark-submit prepared (its master), or a local one under ``python -m``."""
    from airflow_pglogrepl.spark.session import configure, local_session

    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit
        from pyspark.sql import SparkSession

        return configure(SparkSession.builder.appName(app_name)).getOrCreate()
    return local_session(app_name, cores=os.cpu_count() or 2)


def run_app(prog: str, operator: str, run: Callable[[str], dict[str, Any]], *, logger: str) -> int:
    """Run ``run(dsn)`` under the contract; the exit status (0, 1 failed, 2 no DSN)."""
    sys.stdout.flush()
    summary_fd = os.dup(1)
    os.dup2(2, 1)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
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
    except Exception as exc:  # one clear line for the task log; the traceback follows it
        logging.getLogger(logger).exception("%s failed", prog)
        print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        # what failed, for the operator: it raises it again as SparkApplicationError, and the
        # task boundary decides about retries as it would had the error been raised there
        result = {
            "error": type(exc).__name__,
            "message": str(exc),
            "retryable": bool(getattr(exc, "retryable", True)),
        }
        status = 1
    else:
        status = 0
    os.write(summary_fd, (json.dumps(result) + "\n").encode())
    os.close(summary_fd)
    return status
