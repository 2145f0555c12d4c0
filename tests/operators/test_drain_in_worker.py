"""A local master's drain run on the worker starts Spark itself when a merge needs it: a local
session with the master and configuration spark-submit would have had (Delta's jars, the
driver's quiet log settings), so the merge a JVM-free path declines (a TRUNCATE) still lands."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pglogrepl.tables import TableRef
from tests.support.drain import lake_rows
from tests.support.drains import Drains
from tests.support.sources import Source

pytestmark = pytest.mark.spark


def test_a_merge_that_needs_spark_starts_a_local_session_on_the_worker(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    drains = Drains(source, tmp_path)
    first, _ = drains.run(spark_binary=None)
    assert first["spark_start_s"] is None  # a first state is written without a JVM
    source.sql("TRUNCATE t; INSERT INTO t VALUES (1, 'after the truncate')")

    result, _ = drains.run(spark_binary=None)

    assert drains.submits() == 0, "spark-submit was called"
    assert result["spark_start_s"] is not None and result["master"] == "local[1]", result
    assert lake_rows(drains.lake_root, TableRef("public", "t")) == [(1, "after the truncate")]
    logged = capsys.readouterr().out
    assert " INFO SparkContext" not in logged and " INFO DAGScheduler" not in logged  # quiet
