"""A column-mapped Delta table with hostile column names, for the tests of the mapping and of the
commits that change a mapped table's schema."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa

from airflow_pglogrepl.changelog.columns import META_COLUMNS
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.mapping import mapped_schema, to_physical

__all__ = ["HOSTILE", "create_mapped", "hostile_rows"]

HOSTILE = ["sp ace", "a=b", "x(y)", "tab\there", "naïve✓", "é" * 31 + "x", "Name", "name__2"]


def hostile_rows() -> pa.Table:
    """Rows under every kind of name PostgreSQL allows and Delta needs column mapping for,
    nested ones (``_old``, a list of structs) included."""
    old = pa.struct([pa.field(n, pa.int64()) for n in HOSTILE[:2]])
    columns = {name: pa.array([1, 2, None], pa.int64()) for name in HOSTILE}
    columns["when"] = pa.array([dt.datetime(2026, 1, 1)] * 3, pa.timestamp("us"))
    columns["_commit_lsn"] = pa.array([10, 10, 20], pa.int64())
    columns["_old"] = pa.array([{"sp ace": 7, "a=b": 8}, None, {"sp ace": None, "a=b": 9}], old)
    columns["tags"] = pa.array(
        [[{"k y": "v"}], [], None], pa.list_(pa.struct([("k y", pa.string())]))
    )
    return pa.table(columns)


def create_mapped(tmp_path: Path) -> tuple[str, pa.Table]:
    """A column-mapped table at ``tmp_path/t`` holding ``hostile_rows``, and those rows."""
    rows = hostile_rows()
    mapped = mapped_schema(rows.schema, pinned=META_COLUMNS)
    uri = str(tmp_path / "t")
    physical = to_physical(rows, mapped)
    file = delta.write_file(uri, physical, "part")
    delta.create_table(uri, rows.schema, [file], app="a", version=1, configuration={},
                       mapping=mapped)  # fmt: skip
    return uri, rows
