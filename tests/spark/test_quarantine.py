"""One table's bad input never stops the others and never loses a change, against a live
cluster: a value its lake type cannot hold sends that table's changes to the lake's quarantine,
the four other tables are drained and merged, the slot moves on, and the run fails naming the
table and the fix; after the row is corrected and the table re-snapshotted, all five equal the
source, nothing lost or duplicated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.quarantine import held
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import assert_state_equals_source, drain_app, drain_in_process
from tests.support.snapshot import re_snapshot
from tests.support.sources import Source

pytestmark = pytest.mark.spark

TABLES = [TableRef("public", f"t{i}") for i in range(1, 6)]
BAD = TABLES[2]


def _failed(result: Any) -> dict[str, Any]:
    assert result.returncode == 1, result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary


def test_a_value_the_lake_cannot_hold_quarantines_its_table_and_the_others_go_on(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    for ref in TABLES:
        source.sql(f"CREATE TABLE {ref.name} (id int PRIMARY KEY, v text, at timestamp)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR ALL TABLES")
    lake_root = str(tmp_path / "lake")

    def change_all(tag: str, first: int) -> None:
        for ref in TABLES:
            source.sql(f"INSERT INTO {ref.name} SELECT g, '{tag}' || g, '2026-01-01' "
                       f"FROM generate_series({first}, {first + 4}) g")  # fmt: skip
            source.sql(f"UPDATE {ref.name} SET v = v || '+' WHERE id = {first - 5}")

    change_all("a", 5)
    drain_in_process(spark, source, lake_root, window=1 << 30)
    # one transaction with the bad value and a change of another table, then more of each
    source.sql("BEGIN; INSERT INTO t3 VALUES (100, 'bad', '294250-01-01');"
               "UPDATE t1 SET v = 'with bad' WHERE id = 5; COMMIT")  # fmt: skip
    change_all("b", 10)

    summary = _failed(drain_app(source, lake_root))
    assert summary["error"] == "QuarantinedTablesError"
    assert "public.t3" in summary["message"] and "re-snapshot" in summary["message"]
    assert "294250" in summary["message"]
    lake = Lake(lake_root, source.slot)
    slot = source.hook().get_slot(source.slot)
    assert slot.confirmed_flush_lsn == lake.position()  # the slot moved on with the others
    for ref in TABLES:
        if ref != BAD:
            assert_state_equals_source(source, lake_root, ref)
    kept = delta.read_table(lake.paths.quarantine()).to_pylist()
    assert {r["table"] for r in kept} == {"public.t3"}
    bad = next(r for r in kept if r["op"] == "I" and json.loads(r["new"])["id"] == "100")
    assert json.loads(bad["new"])["at"].startswith("294250-01-01")
    assert bad["error"] == "UnstorableValueError"
    first = len(kept)

    # held: its later changes go to the quarantine too, the others still go on
    change_all("c", 15)
    summary = _failed(drain_app(source, lake_root))
    assert summary["error"] == "QuarantinedTablesError" and "public.t3" in summary["message"]
    assert len(delta.read_table(lake.paths.quarantine()).to_pylist()) == first + 6
    for ref in TABLES:
        if ref != BAD:
            assert_state_equals_source(source, lake_root, ref)
    warned = drain_app(source, lake_root, "--on-quarantine", "warn")
    assert warned.returncode == 0 and "QuarantinedTablesError" in warned.stderr
    assert json.loads(warned.stdout.strip().splitlines()[-1])["quarantined"]["public.t3"]

    # the fix: correct the row, re-snapshot the table; every table equals its source
    source.sql("UPDATE t3 SET at = '2026-06-01' WHERE id = 100")
    re_snapshot(spark, source, lake_root, [BAD])
    assert held(Lake(lake_root, source.slot)) == {}
    change_all("d", 20)
    result = drain_app(source, lake_root)
    assert result.returncode == 0, result.stderr[-3000:]
    for ref in TABLES:
        assert_state_equals_source(source, lake_root, ref)
