"""A keyed table's changes as the lives of its rows, on a local Spark: one lineage per row's life
across key changes, named by the segment it began with, its last event, whether it ends with a
row, and each column's latest value actually sent (an unchanged TOAST value is no value)."""

from __future__ import annotations

from typing import Any

from airflow_pglogrepl.merge.lineage import (
    INTERNAL,
    LAST,
    ROOT_KEY,
    ROOT_START,
    alive,
    lineages,
    value_column,
)


def outcome(spark: Any, changes: list[tuple[Any, ...]]) -> tuple[set[tuple[Any, ...]], bool]:
    """``(root key, root start, alive, last key, latest v)`` of each lineage of ``changes``
    (``id`` the key, ``v`` a value), and whether a key moved."""
    from pyspark.sql import functions as sf
    from pyspark.sql.types import (
        ArrayType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    row = [StructField("id", IntegerType()), StructField("v", StringType())]
    schema = StructType(
        [
            *row,
            StructField("_op", StringType()),
            StructField("_commit_lsn", LongType()),
            StructField("_seq", LongType()),
            StructField("_unchanged", ArrayType(StringType())),
            StructField("_old", StructType(row)),
        ]
    )
    found, moved = lineages(spark.createDataFrame(changes, schema), ["id"], ["v"])
    rows = found.select(
        sf.col(ROOT_KEY).getField("k0"),
        sf.col(ROOT_START),
        alive(),
        sf.col(LAST).getField("key").getField("k0"),
        sf.col(value_column(0)).getField("v"),
    ).collect()
    return {(r[0], None if r[1] is None else tuple(r[1]), r[2], r[3], r[4]) for r in rows}, moved


def test_a_row_keeps_one_lineage_across_key_changes_and_its_values_across_keys(spark: Any) -> None:
    found, moved = outcome(
        spark,
        [
            (1, "a", "I", 0x100, 1, [], None),
            (2, None, "U", 0x200, 1, ["v"], (1, None)),  # key 1 -> 2, v unchanged
            (3, None, "U", 0x300, 1, ["v"], (2, None)),  # key 2 -> 3, v unchanged
            (5, None, "D", 0x300, 2, [], None),  # the state's row at 5 deleted
            (7, "x", "U", 0x400, 1, [], None),  # the state's row at 7 updated in place
        ],
    )
    assert moved
    assert found == {
        (1, (0x100, 1), True, 3, "a"),  # inserted at 1, now at 3 with the value sent at 1
        (1, None, False, None, None),  # a key opened by an insert or an arrival: whatever
        (2, None, False, None, None),  # the state held there is gone
        (3, None, False, None, None),
        (5, None, False, 5, None),
        (7, None, True, 7, "x"),
    }


def test_without_key_changes_a_lineage_is_a_segment_at_its_key(spark: Any) -> None:
    found, moved = outcome(
        spark,
        [
            (7, "x", "U", 0x100, 1, [], None),
            (7, None, "U", 0x200, 1, ["v"], None),  # v unchanged: the latest sent is "x"
            (8, "y", "I", 0x200, 2, [], None),
            (8, "y", "D", 0x300, 1, [], None),
        ],
    )
    assert not moved
    assert found == {
        (7, None, True, 7, "x"),
        (8, (0x200, 2), False, 8, "y"),  # inserted, then deleted: dead, whatever it sent
        (8, None, False, None, None),
    }


def test_every_name_the_steps_make_is_internal() -> None:
    names = [ROOT_KEY, ROOT_START, LAST, *(value_column(i) for i in range(12))]
    assert all(n.startswith(INTERNAL) for n in names)
    assert len(set(names)) == len(names)
