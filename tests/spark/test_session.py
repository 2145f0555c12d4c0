"""Delta Lake's jars or packages for a Spark session (``delta_conf``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.spark.session import DELTA_PACKAGES, JARS_ENV, delta_conf

pytestmark = pytest.mark.unit

EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


def test_without_jars_spark_resolves_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JARS_ENV, raising=False)
    conf = delta_conf()
    assert conf["spark.jars.packages"] == ",".join(DELTA_PACKAGES)
    assert conf["spark.sql.extensions"] == EXTENSION and "spark.jars" not in conf


def test_a_jar_folder_goes_to_spark_jars(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(JARS_ENV, str(tmp_path))
    conf = delta_conf()
    assert conf["spark.jars"].split(",") == sorted(str(p) for p in tmp_path.glob("*.jar"))
    assert "spark.jars.packages" not in conf
    monkeypatch.setenv(JARS_ENV, str(tmp_path / "missing.jar"))
    with pytest.raises(FileNotFoundError, match=r"missing\.jar"):
        delta_conf()


@pytest.mark.unit
def test_a_local_master_puts_the_jars_on_the_drivers_class_path() -> None:
    """Not in spark.jars, which would copy each jar (S3A's 650 MiB bundle too) into the
    driver's scratch folder at every start."""
    import os

    from airflow_pglogrepl.spark.session import on_class_path

    conf = {"spark.jars": "/j/a.jar,/j/b.jar", "spark.driver.extraClassPath": "/own.jar",
            "spark.ui.enabled": "false"}  # fmt: skip
    assert on_class_path(conf) == {
        "spark.driver.extraClassPath": os.pathsep.join(["/own.jar", "/j/a.jar", "/j/b.jar"]),
        "spark.ui.enabled": "false",
    }
    packages = {"spark.jars.packages": "io.delta:delta-spark_2.13:4.0.0"}
    assert on_class_path(packages) == packages


def test_spark_writes_row_groups_of_the_lakes_size(spark: Any) -> None:
    """Spark's own 128 MiB groups of a wide history exhausted a 1 GiB driver when its next
    MERGE read them back; the lake's sessions write groups of ``ROW_GROUP_BYTES``."""
    from airflow_pglogrepl.lake.row_groups import ROW_GROUP_BYTES

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    assert hadoop.get("parquet.block.size") == str(ROW_GROUP_BYTES)
