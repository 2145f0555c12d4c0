"""History's column contract: the table's columns as they are, then the history columns."""

from __future__ import annotations

import pyarrow as pa

from airflow_pglogrepl.changelog.columns import KEY_META
from airflow_pglogrepl.changelog.history_columns import (
    ENDING_COLUMNS,
    HISTORY_COLUMNS,
    history_schema,
)


def test_a_history_schema_is_the_tables_columns_then_the_history_columns() -> None:
    table = pa.schema([pa.field("id", pa.int64(), metadata={KEY_META: "0"}),
                       pa.field("_valid", pa.string())])  # fmt: skip
    schema = history_schema(table)
    assert schema.names == ["id", "_valid", *HISTORY_COLUMNS]
    assert schema.field("id").metadata == {KEY_META.encode(): b"0"}  # the key still marked
    assert all(f.nullable for f in schema)  # (Spark reads NOT NULL as an invariant)
    assert set(ENDING_COLUMNS) < set(HISTORY_COLUMNS)
    assert schema.field("_valid_from").type == pa.timestamp("us", tz="UTC")
