"""A Spark frame's columns given the lake's metadata (the key, the source name, the attribute
number), as the snapshot's Spark copy and the backfill's chunks write it."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_pglogrepl.spark.snapshot_spark import with_metadata


@pytest.mark.spark
def test_columns_get_the_metadata_described_and_the_others_keep_theirs(spark: Any) -> None:
    frame = spark.createDataFrame([(1, "a", 2)], "id long, v string, w long")
    marked = with_metadata(frame, {"id": {"pglogrepl.key": "0"}, "v": {}})
    assert [f.metadata for f in marked.schema.fields] == [{"pglogrepl.key": "0"}, {}, {}]
    assert marked.collect() == frame.collect()
