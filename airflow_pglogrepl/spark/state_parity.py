"""The parity check: a table's state in the lake against its source, at the same position.

The source side is a backfill's build (``spark.backfill_state.build``): the source's rows read
in chunks and brought to the lake's position ``E`` by the changes since, typed by the drain's
own mapping, so it is the state the lake must hold at ``E`` value for value. The lake's side
is ``state/<table>`` merged up to ``E``. Both are compared on Spark, without collecting either:

1. each row's hash (``xxhash64`` of every column, with a flag for each NULL, so that NULLs in
   different columns never hash alike), and its key's bucket (one of ``BUCKETS``, by the key's
   hash): per bucket, the row count and the sum of the row hashes, which no order changes;
2. only the buckets that differ are looked into: their rows joined by key, each key missing
   from the lake, extra in it, or with other values, counted, and the first ``SHOWN`` of each
   named (their key's values, as text).
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
    says whether anything does."""
    from pyspark.sql import functions as sf

    expected = spark.read.format("delta").load(expected_uri)
    actual = spark.read.format("delta").load(actual_uri)
    if columns is not None:
        expected = expected.select(*(f"`{c}`" for c in columns))
        actual = actual.select(*(f"`{c}`" for c in actual.columns if c in columns))
    missing_columns = [c for c in expected.columns if c not in actual.columns]
    extra_columns = [c for c in actual.columns if c not in expected.columns]
    columns = [c for c in expected.columns if c in actual.columns]
    e, a = _hashed(expected, columns, keys), _hashed(actual, columns, keys)
    sums = [sf.count(sf.lit(1)).alias("rows"),
            sf.sum(sf.col("_row").cast("decimal(38,0)")).alias("sum")]  # fmt: skip
    per_bucket = (
        e.groupBy("_bucket").agg(*sums).alias("e")
        .join(a.groupBy("_bucket").agg(*sums).alias("a"), "_bucket", "full_outer")
        .where(~sf.col("e.rows").eqNullSafe(sf.col("a.rows"))
               | ~sf.col("e.sum").eqNullSafe(sf.col("a.sum")))
        .select("_bucket")
    )  # fmt: skip
    differing = [int(r["_bucket"]) for r in per_bucket.collect()]
    result: dict[str, Any] = {
        "equal": not differing and not missing_columns and not extra_columns,
        "rows_source": expected.count(),
        "rows_lake": actual.count(),
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

    values = [part for c in columns for part in (sf.col(f"`{c}`"), sf.isnull(f"`{c}`"))]
    return frame.select(
        *(sf.col(f"`{k}`").alias(f"_k{i}") for i, k in enumerate(keys)),
        sf.xxhash64(*values).alias("_row"),
        sf.pmod(sf.xxhash64(*(sf.col(f"`{k}`") for k in keys)), sf.lit(BUCKETS)).alias("_bucket"),
    )


def _narrowed(e: Any, a: Any, keys: list[str], buckets: list[int]) -> dict[str, Any]:
    """The keys of the differing ``buckets``: missing from the lake, extra, or different."""
    from pyspark.sql import functions as sf

    on = [f"_k{i}" for i in range(len(keys))]
    joined = (
        e.where(sf.col("_bucket").isin(buckets)).alias("e")
        .join(a.where(sf.col("_bucket").isin(buckets)).alias("a"), on, "full_outer")
        .select(*on, sf.col("e._row").alias("source"), sf.col("a._row").alias("lake"))
        .where(~sf.col("source").eqNullSafe(sf.col("lake")))
        .withColumn("kind", sf.when(sf.col("lake").isNull(), "missing")
                    .when(sf.col("source").isNull(), "extra").otherwise("different"))
    )  # fmt: skip
    found: dict[str, Any] = {}
    for kind in ("missing", "extra", "different"):
        rows = joined.where(sf.col("kind") == kind)
        found[f"{kind}_rows"] = rows.count()
        shown = rows.select(*on).orderBy(*on).limit(SHOWN).collect()
        found[f"{kind}_keys"] = [
            {k: None if r[c] is None else str(r[c]) for k, c in zip(keys, on, strict=True)}
            for r in shown
        ]
    return found
