"""Spark sessions configured the way the lake needs them: Delta Lake, UTC, Arrow, small footprint.

Delta's jars reach Spark one of two ways. ``PGLOGREPL_DELTA_JARS`` (a directory of jars, or a
comma-separated list of jar paths) puts them in ``spark.jars``: ``make jars`` fetches them from
Maven Central with Maven into ``.cache/jars``, for machines where Spark's own Ivy resolution
cannot reach a registry. Without it, ``spark.jars.packages`` names ``DELTA_PACKAGES`` and Spark
resolves them itself, as ``--packages`` would. The SQL extension and catalog are set only where
the user's configuration does not set them.

A lake on an object store also needs Hadoop's S3A (``S3_PACKAGES``: hadoop-aws of the Hadoop
that pyspark bundles, and the AWS SDK it was built with), from ``s3/`` beside Delta's jars when
``make jars`` fetched them there, and only then: the SDK's jar is large, and a local lake's
session has no use for it. Where the store is and who the lake is to it are set by the
application (``lake.storage.spark_settings``), never on spark-submit's command line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# delta-spark 4.4.0 is built for Spark 4.2 and Scala 2.13 (pyspark 4.2.0 is pinned to match).
DELTA_PACKAGES = ("io.delta:delta-spark_4.2_2.13:4.4.0", "io.delta:delta-storage:4.4.0")
# pyspark 4.2.0 bundles Hadoop 3.5.0's client: S3A must be that version, and hadoop-aws 3.5.0
# was built against the AWS SDK bundle 2.35.4 (and the analytics accelerator it depends on).
S3_PACKAGES = (
    "org.apache.hadoop:hadoop-aws:3.5.0",
    "software.amazon.awssdk:bundle:2.35.4",
    "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1",
)
JARS_ENV = "PGLOGREPL_DELTA_JARS"
# The master and Spark configuration of an application the operator runs without spark-submit
# (a local master: ``operators._in_worker``), as JSON. In the environment, as the DSN is, since a
# configuration may carry object-store credentials.
SPARK_SETTINGS_ENV = "PGLOGREPL_SPARK_SETTINGS"

DELTA_SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_jars(*, object_store: bool = False) -> list[str]:
    """The jar paths ``PGLOGREPL_DELTA_JARS`` names (empty when it is unset), and for a lake on
    an object store the ones in its ``s3/`` folder."""
    value = os.environ.get(JARS_ENV, "").strip()
    if not value:
        return []
    if os.path.isdir(value):
        jars = sorted(str(p) for p in Path(value).glob("*.jar"))
        if not jars:
            raise FileNotFoundError(f"${JARS_ENV}={value} holds no jar; run `make jars`")
        if object_store:
            s3 = sorted(str(p) for p in Path(value, "s3").glob("*.jar"))
            if not s3:
                raise FileNotFoundError(
                    f"${JARS_ENV}={value} has no s3/ folder of jars, which a lake on an object "
                    f"store needs (Hadoop's S3A); run `make jars`"
                )
            jars += s3
        return jars
    jars = [part.strip() for part in value.split(",") if part.strip()]
    missing = [j for j in jars if not os.path.isfile(j)]
    if missing:
        raise FileNotFoundError(f"${JARS_ENV} names jars that do not exist: {missing}")
    if object_store and not any(Path(j).name.startswith("hadoop-aws-") for j in jars):
        raise FileNotFoundError(
            f"${JARS_ENV} lists jars without hadoop-aws, which a lake on an object store needs "
            f"(Hadoop's S3A, with the AWS SDK bundle). Fix: add them to the list "
            f"({', '.join(S3_PACKAGES)}), or name the folder `make jars` fills"
        )
    return jars


def delta_conf(*, object_store: bool = False) -> dict[str, str]:
    """Spark configuration that makes Delta Lake available: jars (or packages), SQL extension;
    and S3A for a lake on an object store."""
    jars = delta_jars(object_store=object_store)
    packages = DELTA_PACKAGES + (S3_PACKAGES if object_store else ())
    where = {"spark.jars": ",".join(jars)} if jars else {"spark.jars.packages": ",".join(packages)}
    return {**where, **DELTA_SQL_CONF}


# Timestamps are stored and compared in UTC whatever the machine's zone, and PostgreSQL's
# ``timestamp`` (no zone) stays a zone-less TIMESTAMP_NTZ instead of being read as UTC; Arrow makes
# the Python <-> JVM hand-over columnar instead of row by row.
LAKE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.timestampType": "TIMESTAMP_NTZ",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # A Delta table's log is replayed in this many partitions; the default (50) costs more in
    # task start-up than it saves on the small logs of a lake's tables.
    "spark.databricks.delta.snapshotPartitions": "2",
    # Parquet row groups of 32 MiB (``lake.row_groups.ROW_GROUP_BYTES``), as the lake's own
    # writers make them: a reader holds a group's column chunk whole, and Spark's own 128 MiB
    # groups of a wide table exhausted a 1 GiB driver when its next MERGE read them back.
    "spark.hadoop.parquet.block.size": str(32 << 20),
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def local_session(app_name: str, cores: int = 2, **conf: str) -> Any:
    """A ``local[cores]`` SparkSession with ``LAKE_CONF`` (pyspark imported here, not at load),
    and S3A when the process's lake is on an object store (``lake.storage``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from airflow_pglogrepl.lake import storage

    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    settings = {
        **delta_conf(object_store=storage.current() is not None),
        **LAKE_CONF,
        **storage.spark_settings(),
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": str(cores * 2),
        **conf,
    }
    for key, value in on_class_path(settings).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def on_class_path(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` for a local master: ``spark.jars`` put on the driver's class path instead.

    Every jar in ``spark.jars`` is copied into the driver's scratch folder (``/tmp/spark-*``,
    removed only at a clean exit) for executors to fetch; a local master's executors run in
    the driver's JVM and need no copy. With S3A's AWS SDK bundle that is 650 MiB per run."""
    jars = [j for j in conf.get("spark.jars", "").split(",") if j.strip()]
    if not jars:
        return conf
    out = {k: v for k, v in conf.items() if k != "spark.jars"}
    before = out.get("spark.driver.extraClassPath")
    out["spark.driver.extraClassPath"] = os.pathsep.join([*([before] if before else []), *jars])
    return out


def session_with(app_name: str, master: str, conf: dict[str, str]) -> Any:
    """A session on ``master`` with ``conf`` as spark-submit would have been given it (the
    operators' configuration already holds Delta's jars and the driver's log settings), plus
    ``LAKE_CONF``. pyspark hands ``conf`` to the JVM it launches, so driver options apply."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in (on_class_path(conf) if master.startswith("local") else conf).items():
        builder = builder.config(key, value)
    return configure(builder).getOrCreate()


def configure(builder: Any) -> Any:
    """Apply ``LAKE_CONF`` and the lake's store (``lake.storage``) to a builder (spark-submit
    runs: master and Delta's jars come from the command line, which the operators fill with
    ``delta_conf``)."""
    from airflow_pglogrepl.lake import storage

    for key, value in {**LAKE_CONF, **storage.spark_settings()}.items():
        builder = builder.config(key, value)
    return builder
