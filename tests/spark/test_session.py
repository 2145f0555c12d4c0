"""Delta Lake's jars or packages for a Spark session (``delta_conf``)."""

from __future__ import annotations

from pathlib import Path

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
