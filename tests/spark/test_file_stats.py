"""A file's statistics gathered batch by batch: null counts of every top-level column, minimum
and maximum of integers and dates only (exact), none of text or nested columns, where a wrong
bound would make a reader skip rows it asked for."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from airflow_pglogrepl.spark.file_stats import ColumnStats

SCHEMA = pa.schema([("id", pa.int64()), ("d", pa.date32()), ("t", pa.string()),
                    ("f", pa.float64()), ("s", pa.struct([("x", pa.int64())]))])  # fmt: skip


def _batch(ids: list[int | None], days: list[dt.date | None]) -> pa.Table:
    n = len(ids)
    return pa.table([pa.array(ids, pa.int64()), pa.array(days, pa.date32()),
                     pa.array(["zz"] * n), pa.array([1.5] * n),
                     pa.array([{"x": 1}] * n, SCHEMA.field("s").type)], schema=SCHEMA)  # fmt: skip


def test_bounds_of_integers_and_dates_and_every_null_count_over_batches() -> None:
    stats = ColumnStats(SCHEMA)
    stats.add(_batch([5, None, 9], [dt.date(2024, 5, 1), None, None]))
    stats.add(_batch([-3, 7], [dt.date(2023, 1, 2), dt.date(2025, 12, 31)]))
    stats.add(_batch([None], [None]))
    assert stats.recorded() == (
        ("id", -3, 9, 2),
        ("d", "2023-01-02", "2025-12-31", 3),
        ("t", None, None, 0),
        ("f", None, None, 0),
    )
    empty = ColumnStats(SCHEMA)
    empty.add(_batch([None], [None]))
    assert empty.recorded()[0] == ("id", None, None, 1)
