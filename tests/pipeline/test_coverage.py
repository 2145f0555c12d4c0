"""Each run compares what the publications cover with what the lake holds, and a difference the
WAL does not carry is never silent: a table added to the publication holding rows, a partition
attached holding rows or detached, each named with its fix, run after run, until a re-snapshot
repairs it or the user accepts it. Partitions and tables created already published are no gap.

Before: every one of these runs exited 0 and said nothing while the lake's state lacked rows
(or kept rows) the source did not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.lake.coverage import Coverage, Gap
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.pipeline.coverage import CoverageCheck, accepted, judge, repaired
from airflow_pglogrepl.postgres.coverage import Leaf, PublishedRelation, SourceCoverage
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import (
    assert_state_equals_source,
    drain_app,
    drain_in_process,
    drain_only,
)
from tests.support.snapshot import re_snapshot
from tests.support.sources import Source

H = 1000  # the horizon of the record the unit tests start from


def rel(oid: int, name: str, *, created: int = 10, published: int | None = 10,
        membership: tuple[int, ...] = (10,), linked: bool = True,
        **leaves: tuple[int, int, bool]) -> PublishedRelation:  # fmt: skip
    """A relation; ``leaves``: name -> (oid, created, linked then)."""
    parts = {o: Leaf(TableRef("public", n), c, b) for n, (o, c, b) in leaves.items()}
    return PublishedRelation(
        oid=oid, table=TableRef("public", name), created=created, created_raw=created,
        published=published, membership=membership, linked_then=linked,
        leaves=parts or {oid: Leaf(TableRef("public", name), created, True)},
    )  # fmt: skip


def now(*relations: PublishedRelation, horizon: int = 2000) -> SourceCoverage:
    return SourceCoverage(horizon=horizon, relations=list(relations))


def reasons(coverage: Coverage) -> dict[str, str]:
    return {g.table: g.reason for g in coverage.gaps.values()}


@pytest.mark.unit
def test_only_what_joined_holding_rows_or_left_is_a_gap() -> None:
    before = judge(None, now(rel(1, "a"), rel(2, "p", p_us=(3, 10, True), p_eu=(4, 10, True)),
                             horizon=H), "0/1")  # fmt: skip
    assert before.gaps == {}
    after = judge(before, now(
        rel(1, "a"),
        rel(2, "p", p_eu=(4, 10, True), p_af=(5, 20, False), p_asia=(6, 1500, True)),
        rel(7, "b", created=20, published=1200),  # added holding rows
        rel(8, "c", created=1600, published=1600, membership=(1600,)),  # created published
    ), "0/2")  # fmt: skip
    assert reasons(after) == {"public.p": "attached", "public.b": "added"}
    assert "p_af" in after.gaps["2/10"].what and after.gaps["7/20"].since == "0/2"
    later = judge(after, now(rel(1, "a"), rel(7, "b", created=20, published=1200),
                             horizon=3000), "0/3")  # fmt: skip
    assert later.gaps["7/20"].since == "0/2"  # carried, not found anew
    assert reasons(later) == {"public.p": "attached", "public.b": "added",
                              "public.c": "removed"}  # fmt: skip
    assert repaired(later, ["public.b"], now(rel(7, "b", created=20, published=1200)))
    assert "public.b" not in reasons(later)


@pytest.mark.unit
def test_nothing_older_than_the_record_is_taken_as_born() -> None:
    """Before (a review found each): a table created with its listing in a publication the
    drain was then given, leaves of a root whose publish_via_partition_root was turned off,
    and a table whose OID was reused were all taken as whole."""
    record = judge(None, now(rel(1, "a"), horizon=H), "0/1")
    old_in_new_pub = rel(2, "old", created=50, published=50, membership=(50,))
    reused = rel(1, "a2", created=1500, published=1600, membership=(1600,))
    found = judge(record, now(old_in_new_pub, reused), "0/2")
    assert reasons(found) == {"public.old": "added", "public.a2": "added", "public.a": "removed"}


@pytest.mark.unit
def test_a_table_published_again_or_renamed_keeps_its_gap_and_a_warning_gives_way() -> None:
    record = judge(None, now(rel(1, "a"), rel(2, "k"), horizon=H), "0/1")
    again = judge(record, now(rel(1, "a", membership=(1500,), published=1500), rel(2, "k")),
                  "0/2")  # fmt: skip
    assert reasons(again) == {"public.a": "added"}  # removed and added between two runs
    gone = judge(record, now(rel(1, "a")), "0/2")
    assert reasons(gone) == {"public.k": "removed"}
    back = judge(gone, now(rel(1, "a"), rel(2, "k", membership=(2500,), published=2500),
                           horizon=3000), "0/3")  # fmt: skip
    assert reasons(back) == {"public.k": "added"}  # fails the run: the warning gave way
    renamed = judge(back, now(rel(1, "a"), rel(2, "k2", membership=(2500,), published=2500),
                              horizon=4000), "0/4")  # fmt: skip
    assert list(renamed.gaps) == ["2/10"]  # by OID: the rename keeps it, under its new name
    assert renamed.gaps["2/10"].table == "public.k2" and "public.k2" in renamed.gaps["2/10"].fix
    assert repaired(renamed, ["public.k2"], now(rel(2, "k2", membership=(2500,))))


class GivenCoverage:
    """What the check asks of its source: the coverage, as given."""

    def __init__(self, *relations: PublishedRelation, horizon: int) -> None:
        self.coverage = now(*relations, horizon=horizon)

    def publication_coverage(self, names: list[str], *, known: Any = None) -> SourceCoverage:
        return self.coverage


@pytest.mark.unit
def test_a_table_made_again_under_its_name_fails_the_run_though_the_old_one_only_warns(
    tmp_path: Path,
) -> None:
    """Before (a review found it): by name, the old relation's "removed" warning took the
    place of the new one's "added", and the run succeeded without its rows."""
    lake = Lake(str(tmp_path / "lake"), "slot")
    CoverageCheck(GivenCoverage(rel(1, "t"), horizon=H), lake, ["p"]).run()  # type: ignore[arg-type]
    again = GivenCoverage(
        rel(2, "t", created=1500, published=1600, membership=(1600,)), horizon=2000
    )
    gaps = CoverageCheck(again, lake, ["p"]).run()  # type: ignore[arg-type]
    assert {t: g.reason for t, g in gaps.items()} == {"public.t": "added"}


@pytest.mark.unit
def test_accepting_takes_the_named_reason_only() -> None:
    record = judge(None, now(rel(2, "p", p_us=(3, 10, True)), horizon=H), "0/1")
    found = judge(record, now(rel(2, "p", p_af=(5, 20, False))), "0/2")
    assert reasons(found) == {"public.p": "attached"}
    assert accepted(found, ["public.p:detached"]) == []
    assert accepted(found, ["p:attached"]) == ["public.p (attached)"]
    assert found.gaps == {}


@pytest.mark.unit
def test_a_lake_that_began_with_a_snapshot_holds_what_it_copied() -> None:
    found = judge(None, now(rel(1, "a"), rel(2, "b")), "0/5", snapshot_tables=["public.a"])
    assert reasons(found) == {"public.b": "added"}


@pytest.mark.unit
def test_a_record_reads_back_as_written() -> None:
    coverage = Coverage({1: {"table": "public.a", "leaves": {"1": "public.a"}}},
                        {"2/9": Gap("public.b", "added", "w", "f", "0/1")}, 3, 77)  # fmt: skip
    again = Coverage.parse(coverage.document(), 3)
    assert again == coverage


def _rows(src: Source, table: str, first: int, count: int) -> None:
    src.sql(f"INSERT INTO {table} SELECT g, 'r' || g FROM generate_series(%s::int, %s) g",
            (first, first + count - 1))  # fmt: skip


def test_a_table_added_to_the_publication_holding_rows_is_named_until_repaired(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """The issue's first case: b holds 300 rows when it is added; 50 inserted and 20 updated
    after. The run fails naming b and the fix, the changes are committed all the same, and a
    re-snapshot of b makes the state equal and the report stop."""
    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE a")
    _rows(source, "a", 1, 10)
    assert drain_only(source, lake_root, window=1 << 20).incomplete == {}
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text)")
    _rows(source, "b", 1, 300)
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
    _rows(source, "b", 301, 50)
    source.sql("UPDATE b SET v = 'u' WHERE id <= 20")
    failed = drain_app(source, lake_root, "--no-materialize", "--on-incomplete", "report")
    assert failed.returncode == 1
    assert "LakeIncompleteError" in failed.stderr and "public.b" in failed.stderr
    assert "snapshot_app --table public.b" in failed.stderr
    again = drain_only(source, lake_root, window=1 << 20)  # nothing new: still named
    assert list(again.incomplete) == ["public.b"]
    assert again.incomplete["public.b"]["reason"] == "added"
    re_snapshot(spark, source, lake_root, [TableRef("public", "b")])
    result = drain_in_process(spark, source, lake_root, window=1 << 20)
    assert result["incomplete"] == {}
    assert_state_equals_source(source, lake_root, TableRef("public", "b"))


def test_partitions_attached_or_detached_are_named_created_ones_are_not(
    source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE parted (id int, region text, PRIMARY KEY (id, region))"
               " PARTITION BY LIST (region)")  # fmt: skip
    source.sql("CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE parted"
               " WITH (publish_via_partition_root = true)")  # fmt: skip
    source.sql("INSERT INTO parted SELECT g, 'us' FROM generate_series(1, 20) g")
    assert drain_only(source, lake_root, window=1 << 20).incomplete == {}
    source.sql("CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')")
    source.sql("INSERT INTO parted SELECT g, 'eu' FROM generate_series(1, 20) g")
    assert drain_only(source, lake_root, window=1 << 20).incomplete == {}  # created: whole
    source.sql("CREATE TABLE parted_af (id int, region text, PRIMARY KEY (id, region))")
    source.sql("INSERT INTO parted_af SELECT g, 'af' FROM generate_series(1, 50) g")
    source.sql("ALTER TABLE parted ATTACH PARTITION parted_af FOR VALUES IN ('af')")
    attached = drain_only(source, lake_root, window=1 << 20).incomplete
    assert attached["public.parted"]["reason"] == "attached"
    assert "parted_af" in attached["public.parted"]["what"]
    kept = drain_only(source, lake_root, window=1 << 20, accept_incomplete=["parted"])
    assert kept.incomplete == {}
    source.sql("ALTER TABLE parted DETACH PARTITION parted_us")
    detached = drain_only(source, lake_root, window=1 << 20).incomplete
    assert detached["public.parted"]["reason"] == "detached"
    assert "parted_us" in detached["public.parted"]["what"]
