"""The parity check: a table's state in the lake against its source, at the same position.

The source side is a backfill's build (``spark.backfill_state.build``): the source's rows read
in chunks and brought to the lake's position ``E`` by the changes since, typed by the drain's
own mapping, so it is the state the lake must hold at ``E`` value for value. The lake's side
is ``state/<table>`` merged up to ``E``. Both are compared on Spark, without collecting either:

1. each row's hash (``xxhash64`` of every column, with a flag for each NULL, so that NULLs in
   different columns never hash alike; a nested value as its JSON text, so that a NULL inside
   it counts), and its key's bucket (one of ``BUCKETS``, by the key's hash): per bucket, the
   row count and the sum of the row hashes, which no order changes;
2. only the buckets that differ are looked into: their rows joined by key, each key missing
   from the lake, extra in it, with other values, or held by more than one row, counted, and
   the first ``SHOWN`` of each named (their key's values, as text).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUCKETS", "SHOWN", "compare"]

BUCKETS = 1024
SHOWN = 20


def compare(spark: Any, expected_uri: str, actual_uri: str, keys: list[str], *,
            columns: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """What differs between the Delta tables at ``expected_uri`` (the source) and
    ``actual_uri`` (the lake), over ``columns`` (default: all of the source's); ``equal``
    says whether anything does. One Spark job when equal, three when not."""
    expected = spark.read.format("delta").load(expected_uri)
    actual = spark.read.format("delta").load(actual_uri)
    if columns is not None:
        expected = expected.select(*(f"`{c}`" for c in columns))
        actual = actual.select(*(f"`{c}`" for c in actual.columns if c in columns))
    missing_columns = [c for c in expected.columns if c not in actual.columns]
    extra_columns = [c for c in actual.columns if c not in expected.columns]
    columns = [c for c in expected.columns if c in actual.columns]
    e, a = _hashed(expected, columns, keys), _hashed(actual, columns, keys)
    buckets = _per_bucket(e, a)  # (the bucket, rows in the source, rows in the lake, differs)
    differing = [b for b, _, _, differs in buckets if differs]
    result: dict[str, Any] = {
        "equal": not differing and not missing_columns and not extra_columns,
        "rows_source": sum(n for _, n, _, _ in buckets),
        "rows_lake": sum(n for _, _, n, _ in buckets),
        "buckets": BUCKETS,
        "buckets_differing": len(differing),
    }
    if missing_columns or extra_columns:
        result["columns_missing"], result["columns_extra"] = missing_columns, extra_columns
    if differing:
        result.update(_narrowed(e, a, keys, differing))
    return result


def _hashed(frame: Any, columns: list[str], keys: list[str]) -> Any:
    from pyspark.sql import functions as sf
    from pyspark.sql.types import ArrayType, MapType, StructType

    nested = {f.name for f in frame.schema.fields
              if isinstance(f.dataType, ArrayType | MapType | StructType)}  # fmt: skip

    def value(c: str) -> Any:
        # xxhash64 skips a NULL inside an array, map or struct ([1, NULL] hashes as [1]): a
        # nested value is hashed as its JSON text, which keeps every NULL in its place
        if c in nested:
            return sf.to_json(sf.col(f"`{c}`"), {"ignoreNullFields": "false"})
        return sf.col(f"`{c}`")

    values = [part for c in columns for part in (value(c), sf.isnull(f"`{c}`"))]
    return frame.select(
        *(sf.col(f"`{k}`").alias(f"_k{i}") for i, k in enumerate(keys)),
        sf.xxhash64(*values).alias("_row"),
        sf.pmod(sf.xxhash64(*(sf.col(f"`{k}`") for k in keys)), sf.lit(BUCKETS)).alias("_bucket"),
    )


def _per_bucket(e: Any, a: Any) -> list[tuple[int, int, int, bool]]:
    """Each bucket's row counts on both sides and whether it differs (count or hash sum): at
    most ``BUCKETS`` rows, collected at once."""
    from pyspark.sql import functions as sf

    sums = [sf.count(sf.lit(1)).alias("rows"),
            sf.sum(sf.col("_row").cast("decimal(38,0)")).alias("sum")]  # fmt: skip
    joined = (
        e.groupBy("_bucket").agg(*sums).alias("e")
        .join(a.groupBy("_bucket").agg(*sums).alias("a"), "_bucket", "full_outer")
        .select("_bucket", sf.coalesce("e.rows", sf.lit(0)).alias("e_rows"),
                sf.coalesce("a.rows", sf.lit(0)).alias("a_rows"),
                (~sf.col("e.rows").eqNullSafe(sf.col("a.rows"))
                 | ~sf.col("e.sum").eqNullSafe(sf.col("a.sum"))).alias("differs"))
    )  # fmt: skip
    return [(int(r[0]), int(r[1]), int(r[2]), bool(r[3])) for r in joined.collect()]


def _narrowed(e: Any, a: Any, keys: list[str], buckets: list[int]) -> dict[str, Any]:
    """The keys of the differing ``buckets``: missing from the lake, extra, different, or held
    by more than one row of a side (``duplicate``: the join by key cannot tell those apart)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    on = [f"_k{i}" for i in range(len(keys))]
    e, a = e.where(sf.col("_bucket").isin(buckets)), a.where(sf.col("_bucket").isin(buckets))
    per_key = [sf.count(sf.lit(1)).alias("n"), sf.min("_row").alias("_row")]
    joined = (
        e.groupBy(*on).agg(*per_key).alias("e")
        .join(a.groupBy(*on).agg(*per_key).alias("a"), on, "full_outer")
        .withColumn("kind", sf.when((sf.col("e.n") > 1) | (sf.col("a.n") > 1), "duplicate")
                    .when(sf.col("a.n").isNull(), "missing")
                    .when(sf.col("e.n").isNull(), "extra")
                    .when(sf.col("e._row") != sf.col("a._row"), "different"))
        .where(sf.col("kind").isNotNull())
        .select(*on, "kind")
    ).cache()  # fmt: skip
    try:
        counts = {r["kind"]: int(r["count"]) for r in joined.groupBy("kind").count().collect()}
        first = Window.partitionBy("kind").orderBy(*on)
        shown = (
            joined.withColumn("_n", sf.row_number().over(first))
            .where(sf.col("_n") <= SHOWN).orderBy("kind", *on).collect()
        )  # fmt: skip
    finally:
        joined.unpersist()
    found: dict[str, Any] = {}
    for kind in ("missing", "extra", "different", "duplicate"):
        found[f"{kind}_rows"] = counts.get(kind, 0)
        found[f"{kind}_keys"] = [
            {k: None if r[c] is None else str(r[c]) for k, c in zip(keys, on, strict=True)}
            for r in shown
            if r["kind"] == kind
        ]
    return found
