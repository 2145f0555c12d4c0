"""Which way a table is copied, without a server: by the engine asked for, else by the heap's
size; a re-snapshot on Spark; and a run that copies only small tables never asks for Spark."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_pglogrepl.postgres.snapshot import SnapshotTable
from airflow_pglogrepl.spark.snapshot_engine import (
    BLOCK_BYTES,
    check_engine,
    on_spark,
    spark_needed,
)
from airflow_pglogrepl.tables import TableRef


def _table(blocks: int) -> SnapshotTable:
    return SnapshotTable(
        table=TableRef("public", "t"), relid=1, relkind="r", replica_identity="d", columns=(),
        row_filter=None, blocks=blocks, reltuples=-1, relpages=0, publications=("p",),
        span=blocks,
    )  # fmt: skip


def test_auto_copies_a_heap_bigger_than_the_threshold_on_spark_and_the_rest_in_process() -> None:
    above = 10 * BLOCK_BYTES
    assert not on_spark(_table(10), engine="auto", resnapshot=False, above=above)
    assert on_spark(_table(11), engine="auto", resnapshot=False, above=above)
    assert on_spark(_table(0), engine="spark", resnapshot=False, above=above)
    assert not on_spark(_table(10**9), engine="process", resnapshot=False, above=above)
    assert on_spark(_table(0), engine="process", resnapshot=True, above=above)  # Spark's writer


def test_an_unknown_engine_is_refused_naming_the_choices() -> None:
    assert check_engine("process") == "process"
    with pytest.raises(ValueError, match=r"'jvm' is none of auto, process, spark"):
        check_engine("jvm")


class _Source:
    """Only what ``spark_needed`` asks of a source: a session and its parameters; the
    published tables' sizes are what the query would give."""

    def __init__(self) -> None:
        self.sessions = 0

    def connection_params(self) -> dict[str, str]:
        return {}

    def session(self) -> Any:
        self.sessions += 1
        raise AssertionError("no catalog query expected")


def test_spark_is_started_ahead_only_when_a_table_will_need_it() -> None:
    source = _Source()
    assert spark_needed(source, ["p"], None, engine="spark", above=0)
    assert not spark_needed(source, ["p"], None, engine="process", above=0)
    assert spark_needed(source, ["p"], [TableRef("public", "t")], engine="auto", above=0)
    assert source.sessions == 0
