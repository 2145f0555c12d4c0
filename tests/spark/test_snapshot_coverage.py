"""What a re-snapshot records of the tables it copied: whole again when the catalog stood still
since its point; left reported when it moved (a partition detached after the point would
otherwise be recorded as gone while the copy still holds its rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_pglogrepl.exceptions import CatalogChangedError
from airflow_pglogrepl.lake import coverage
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.coverage import CoverageCheck
from airflow_pglogrepl.postgres.connect import connect, dsn_params
from airflow_pglogrepl.postgres.source import PgSource
from airflow_pglogrepl.spark.snapshot_coverage import record_coverage
from tests.support.databases import Database


class Guard:
    """The snapshot guard's two parts this needs: its session, and its verdict."""

    def __init__(self, conn: Any, moved: bool) -> None:
        self.conn = conn
        self.moved = moved

    def verify(self) -> None:
        if self.moved:
            raise CatalogChangedError(["now partition parted_af"])


def test_a_re_snapshot_records_its_tables_whole_only_if_the_catalog_stood_still(
    database: Database, tmp_path: Path
) -> None:
    database.sql("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    database.sql("CREATE PUBLICATION p FOR TABLE a")
    source = PgSource(database.cluster.dsn(database.name))
    lake = Lake(str(tmp_path / "lake"), "slot")
    CoverageCheck(source, lake, ["p"]).run()
    database.sql("INSERT INTO b VALUES (1); ALTER PUBLICATION p ADD TABLE b")
    assert list(CoverageCheck(source, lake, ["p"]).run()) == ["public.b"]
    with connect(dsn_params(database.cluster.dsn(database.name)), label="test") as conn:
        record_coverage(lake, Guard(conn, moved=True), ["p"], LSN(1), ["public.b"],
                        initial=False)  # fmt: skip
        recorded = coverage.read(lake)
        assert recorded is not None and [g.table for g in recorded.gaps.values()] == ["public.b"]
        record_coverage(lake, Guard(conn, moved=False), ["p"], LSN(1), ["public.b"],
                        initial=False)  # fmt: skip
    recorded = coverage.read(lake)
    assert recorded is not None and recorded.gaps == {}
    assert CoverageCheck(source, lake, ["p"]).run() == {}
