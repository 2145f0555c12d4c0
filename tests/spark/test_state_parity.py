"""The parity check: each damage to a state is found (rows missing, extra, different), named
by key, and equal is reported once repaired; the comparison itself tells NULLs in different
columns apart, and NULLs inside arrays and structs, names a key the lake holds twice, and compares
the lake's columns as well as its rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.spark.state_parity import compare
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import assert_state_equals_source, drain_in_process
from tests.support.sources import Source

B = TableRef("public", "b")


def _write(spark: Any, path: str, rows: list[tuple[Any, ...]], schema: str) -> None:
    frame = spark.createDataFrame(rows, schema)
    frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def test_nulls_in_other_columns_differ_and_so_do_columns(spark: Any, tmp_path: Path) -> None:
    source, lake = str(tmp_path / "s"), str(tmp_path / "l")
    _write(spark, source, [(1, None, "x"), (2, "y", None)], "id long, a string, b string")
    _write(spark, lake, [(1, "x", None), (2, "y", None)], "id long, a string, b string")
    found = compare(spark, source, lake, ["id"])
    assert not found["equal"] and found["different_rows"] == 1
    assert found["different_keys"] == [{"id": "1"}] and found["missing_rows"] == 0
    _write(spark, lake, [(1, None), (2, "y")], "id long, a string")
    found = compare(spark, source, lake, ["id"])
    assert not found["equal"] and found["columns_missing"] == ["b"]
    _write(spark, lake, [(2, "y", None), (1, None, "x")], "id long, a string, b string")
    assert compare(spark, source, lake, ["id"])["equal"]  # any order


def test_nulls_inside_nested_values_differ_and_a_key_held_twice_is_named(
    spark: Any, tmp_path: Path
) -> None:
    source, lake = str(tmp_path / "s"), str(tmp_path / "l")
    schema = "id long, xs array<int>, s struct<a:int,b:int>"
    _write(spark, source, [(1, [1, None], (1, None)), (2, [2], (None, 2))], schema)
    _write(spark, lake, [(1, [1], (1, None)), (2, [2], (2, None))], schema)
    found = compare(spark, source, lake, ["id"])
    assert found["different_rows"] == 2 and found["different_keys"] == [{"id": "1"}, {"id": "2"}]
    _write(spark, lake, [(1, [1, None], (1, None)), (2, [2], (None, 2)), (2, [2], (None, 2))],
           schema)  # fmt: skip
    found = compare(spark, source, lake, ["id"])
    assert not found["equal"] and found["rows_lake"] == 3 and found["rows_source"] == 2
    assert found["duplicate_rows"] == 1 and found["duplicate_keys"] == [{"id": "2"}]
    assert found["different_rows"] == found["missing_rows"] == found["extra_rows"] == 0


def test_the_check_finds_each_damage_and_then_equal_after_the_repair(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")

    def drain(**kwargs: Any) -> dict[str, Any]:
        return drain_in_process(
            spark, source, lake_root, window=1 << 20, backfill_rows=1000, **kwargs
        )  # one chunk

    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text, pad text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE b")
    source.sql("INSERT INTO b SELECT g, 'b', 'p' FROM generate_series(1, 200) g")
    drain()
    state = f"{lake_root}/state/{table_dir(B)}"
    spark.sql(f"DELETE FROM delta.`{state}` WHERE id <= 30")
    spark.sql(f"UPDATE delta.`{state}` SET v = 'hand' WHERE id = 151")
    extra = (
        spark.read.format("delta").load(state).limit(5).selectExpr("id + 1000 AS id", "v", "pad")
    )
    extra.write.format("delta").mode("append").save(state)
    source.sql("UPDATE b SET v = 'during' WHERE id % 50 = 0")  # changes while it checks
    found = drain(parity=["public.b"])["parity"]["public.b"]
    assert not found["equal"]
    assert (found["missing_rows"], found["extra_rows"], found["different_rows"]) == (30, 5, 1)
    assert found["missing_keys"][0] == {"id": "1"} and found["different_keys"] == [{"id": "151"}]
    found = drain(parity=["public.b"], parity_repair=True)["parity"]["public.b"]
    assert found["repaired"] and found["missing_rows"] == 30
    assert_state_equals_source(source, lake_root, B)
    source.sql("ALTER TABLE b DROP COLUMN pad")  # the lake keeps its values: not compared
    source.sql("UPDATE b SET v = 'after' WHERE id = 7")
    found = drain(parity=["public.b"])["parity"]["public.b"]  # no difference is found either
    assert found["equal"] and found["rows_source"] == found["rows_lake"] == 200
