"""How the operators make Delta Lake available to Spark without overriding the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pglogrepl.operators._spark import with_delta
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
