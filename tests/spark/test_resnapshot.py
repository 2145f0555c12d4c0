"""A drain run repairs what the WAL does not carry, with no pause of the drain asked of anyone:
a table added to the publication holding rows, a partition attached holding rows or detached
under a root published via its root, each copied again in the run and equal to its source
after it; the same as leaves published on their own, equal or named with the fix.

Before: each of these runs ended well while the state lacked rows (280 of 350 in the first
case) or kept rows the source no longer had."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.pipeline.coverage import CoverageCheck
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import assert_state_equals_source, drain_in_process
from tests.support.partitions import attach_and_detach_under_the_root
from tests.support.sources import Source

WINDOW = 1 << 20


def _drain(spark: Any, source: Source, lake_root: str) -> dict[str, Any]:
    return drain_in_process(spark, source, lake_root, window=WINDOW, resnapshot=True)


def test_a_table_added_holding_rows_is_copied_by_the_next_run(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE a")
    source.sql("INSERT INTO a SELECT g, 'a' FROM generate_series(1, 10) g")
    assert _drain(spark, source, lake_root)["incomplete"] == {}
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text)")
    source.sql("INSERT INTO b SELECT g, 'b' FROM generate_series(1, 300) g")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
    source.sql("INSERT INTO b SELECT g, 'b' FROM generate_series(301, 350) g")
    source.sql("UPDATE b SET v = 'u' WHERE id <= 20")
    result = _drain(spark, source, lake_root)
    assert result["incomplete"] == {}
    for name in ("a", "b"):
        assert_state_equals_source(source, lake_root, TableRef("public", name))
    source.sql("UPDATE b SET v = 'after' WHERE id > 340; DELETE FROM b WHERE id < 5")
    assert _drain(spark, source, lake_root)["incomplete"] == {}  # once: nothing to repair
    assert_state_equals_source(source, lake_root, TableRef("public", "b"))


def test_a_lake_whose_runs_were_all_idle_has_a_table_added_copied(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """A drain's lake with no commit yet (its runs found nothing to read): the re-snapshot of
    one table refused it, naming an initial snapshot as the fix."""
    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE a")
    # what a first run that found nothing to read leaves: its claim and its coverage record,
    # no commit (a real run may meet other databases' WAL on the shared cluster, and commit)
    hook = source.hook()
    lake = Lake(lake_root, source.slot)
    lake.claim(hook.source_identity(), publications=[source.publication], began_with="drain")
    CoverageCheck(hook, lake, [source.publication]).run()
    assert lake.position() is None
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text)")
    source.sql("INSERT INTO b SELECT g, 'b' FROM generate_series(1, 30) g")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
    source.sql("INSERT INTO a VALUES (1, 'a'); UPDATE b SET v = 'u' WHERE id <= 3")
    assert _drain(spark, source, lake_root)["incomplete"] == {}
    for name in ("a", "b"):
        assert_state_equals_source(source, lake_root, TableRef("public", name))


def test_partitions_attached_or_detached_under_the_root_leave_it_equal(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    attach_and_detach_under_the_root(source, lake_root, lambda: _drain(spark, source, lake_root))


def test_leaves_published_on_their_own_are_copied_or_named(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE parted (id int, region text, PRIMARY KEY (id, region))"
               " PARTITION BY LIST (region)")  # fmt: skip
    source.sql("CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE parted")
    source.sql("INSERT INTO parted SELECT g, 'us' FROM generate_series(1, 20) g")
    _drain(spark, source, lake_root)
    source.sql("CREATE TABLE parted_af (id int, region text, PRIMARY KEY (id, region))")
    source.sql("INSERT INTO parted_af SELECT g, 'af' FROM generate_series(1, 50) g")
    source.sql("ALTER TABLE parted ATTACH PARTITION parted_af FOR VALUES IN ('af')")
    assert _drain(spark, source, lake_root)["incomplete"] == {}
    assert_state_equals_source(source, lake_root, TableRef("public", "parted_af"))
    source.sql("ALTER TABLE parted DETACH PARTITION parted_us")
    removed = _drain(spark, source, lake_root)["incomplete"]
    assert removed["public.parted_us"]["reason"] == "removed"  # named, its lake tables kept


def test_a_repair_that_fails_leaves_the_table_named_with_why_and_the_run_drains_on(
    source: Source, tmp_path: Path
) -> None:
    """Before (a review found it): only the product's own errors were caught, so a Spark that
    would not start failed every run before the slot was read, while WAL piled up."""
    import time

    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.pipeline.drain import Drain
    from airflow_pglogrepl.spark.resnapshot import Resnapshot

    def no_spark() -> Any:
        raise RuntimeError("Java gateway process exited before sending its port number")

    source.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE a")
    hook, lake_root = source.hook(), str(tmp_path / "lake")

    def run() -> Any:  # a drain run whose repair cannot start Spark
        repair = Resnapshot(spark=no_spark, source=hook, lake=lake, slot=source.slot,
                            publications=[source.publication])  # fmt: skip
        drain = Drain(source=hook, lake=lake, slot=source.slot, max_window_bytes=WINDOW,
                      publications=[source.publication], repair=repair)  # fmt: skip
        return drain.run(time.monotonic())

    with hook.writer_lock(source.slot) as lock:
        lake = Lake(lake_root, source.slot, origins=hook.column_origins, writer_check=lock.check)
        run()
        source.sql("CREATE TABLE b (id int PRIMARY KEY, v text); INSERT INTO b VALUES (1, 'b')")
        source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
        source.sql("INSERT INTO a VALUES (1, 'a'); INSERT INTO b VALUES (2, 'b')")
        result = run()
    assert result.incomplete["public.b"]["reason"] == "added"
    assert "Java gateway process exited" in result.incomplete["public.b"]["repair"]
    assert result.to_dict()["changes"] == 2  # drained all the same
