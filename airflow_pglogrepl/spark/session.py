"""Spark sessions configured the way the sink needs them (UTC, Arrow, small local footprint)."""

from __future__ import annotations

import os
import sys
from typing import Any

# Timestamps are stored and compared in UTC whatever the machine's zone, and PostgreSQL's
# ``timestamp`` (no zone) stays a zone-less TIMESTAMP_NTZ instead of being read as UTC; Arrow makes
# the Python <-> JVM hand-over columnar instead of row by row.
SINK_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.timestampType": "TIMESTAMP_NTZ",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def local_session(app_name: str, cores: int = 2, **conf: str) -> Any:
    """A ``local[cores]`` SparkSession with ``SINK_CONF`` (pyspark imported here, not at load)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    settings = {
        **SINK_CONF,
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": str(cores * 2),
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def configure(builder: Any) -> Any:
    """Apply ``SINK_CONF`` to a builder (spark-submit runs: master comes from the command line)."""
    for key, value in SINK_CONF.items():
        builder = builder.config(key, value)
    return builder
