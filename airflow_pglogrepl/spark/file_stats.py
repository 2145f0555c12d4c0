"""A data file's column statistics, gathered batch by batch as it is written: what Delta readers
skip files by, for the files a snapshot writes without Spark.

Recorded only where a wrong value cannot arise: the null count of every top-level column, and
the minimum and maximum of integers and dates (exact in JSON, no truncation or rounding, unlike
text, floats or timestamps, where Spark's writer has rules of its own). A statistic left out
only costs skipping, while a wrong one would make a reader skip a file holding rows it asked
for. Keys of the stored names: physical ones under column mapping, as Delta reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ColumnStats"]

# Delta collects statistics for a table's first 32 columns by default
# (``delta.dataSkippingNumIndexedCols``): the same here.
INDEXED_COLUMNS = 32


class ColumnStats:
    """Null counts, and minimum and maximum where exact, of the columns of one file."""

    def __init__(self, schema: pa.Schema) -> None:
        import pyarrow as pa

        fields = list(schema)[:INDEXED_COLUMNS]
        self._counted = [f.name for f in fields if not pa.types.is_nested(f.type)]
        self._bounded = {f.name for f in fields if pa.types.is_integer(f.type)
                         or pa.types.is_date32(f.type)}  # fmt: skip
        self._nulls = dict.fromkeys(self._counted, 0)
        self._low: dict[str, Any] = {}
        self._high: dict[str, Any] = {}

    def add(self, table: pa.Table) -> None:
        """Count ``table``'s rows in (a batch of the file, its columns under stored names)."""
        import pyarrow.compute as pc

        for name in self._counted:
            column = table.column(name)
            self._nulls[name] += column.null_count
            if name not in self._bounded or column.null_count == len(column):
                continue
            bounds = pc.min_max(column)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            self._low[name] = low if name not in self._low else min(self._low[name], low)
            self._high[name] = high if name not in self._high else max(self._high[name], high)

    def recorded(self) -> tuple[tuple[str, Any, Any, int], ...]:
        """``(name, min, max, null count)`` per column, min and max None where not recorded,
        in JSON's form (a date as ``YYYY-MM-DD``)."""

        def shown(value: Any) -> Any:
            return value.isoformat() if hasattr(value, "isoformat") else value

        return tuple(
            (name, shown(self._low.get(name)), shown(self._high.get(name)), self._nulls[name])
            for name in self._counted
        )
