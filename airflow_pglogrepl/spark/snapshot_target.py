"""Where and how one table's snapshot copy is written: the same for Spark's copy and the one made
in the application's own process, so the two give the lake the same table.

A copy's target says the directory (staged or the state itself), the lake's name of each source
column and its metadata (the key's position, the source name when it differs, the attribute
number), whether the table needs Delta's column mapping, and the version's app transaction. The
two ways of copying (``spark.snapshot_spark``, ``spark.snapshot_arrow``) take it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_pglogrepl.lake import column_names
from airflow_pglogrepl.lake.evolve import ATTNUM_META
from airflow_pglogrepl.spark.range_copy import plain_schema, table_info

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.postgres.snapshot import SnapshotTable

__all__ = ["CopyTarget", "Written", "column_metadata", "lake_schema"]


@dataclass(frozen=True)
class CopyTarget:
    """One table's copy: written to ``uri`` as one Delta version carrying ``(app, version)``."""

    uri: str
    lake_names: Mapping[str, str]  # source name -> lake name, in the source's column order
    schema: pa.Schema  # the lake's names, each field's metadata (``column_metadata``)
    mapped: bool  # a lake name needs column mapping
    configuration: Mapping[str, str]  # the table's Delta properties (``Lake.state_config``)
    app: str
    version: int
    resnapshot: bool  # into the state table itself (else staged, published later)

    @property
    def renamed(self) -> dict[str, str]:
        """``source name -> lake name`` of the columns stored under another name."""
        return {s: n for s, n in self.lake_names.items() if s != n}


@dataclass(frozen=True)
class Written:
    """What writing a copy did."""

    rows: int
    copy_bytes: int  # Arrow bytes the readers fetched (as ADBC typed them), not wire bytes
    tasks: int  # block ranges read


def column_metadata(
    table: SnapshotTable, lake_names: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    """Each lake column's metadata: its position in the key (``pglogrepl.key``, as the
    changelog marks it), its source name when stored under another
    (``column_names.SOURCE_META``), its attribute number (``pglogrepl.attnum``: how the drain
    tells a later rename from a drop and an add)."""
    from airflow_pglogrepl.changelog.columns import KEY_META

    position = {lake_names[k]: i for i, k in enumerate(table_info(table).key_names)}
    sources = {n: s for s, n in lake_names.items() if s != n}
    attnums = {lake_names[c.name]: c.attnum for c in table.columns if c.name in lake_names}
    described = {}
    for name in lake_names.values():
        described[name] = {
            **({KEY_META: str(position[name])} if name in position else {}),
            **({column_names.SOURCE_META: sources[name]} if name in sources else {}),
            **({ATTNUM_META: str(attnums[name])} if name in attnums else {}),
        }
    return described


def lake_schema(table: SnapshotTable, lake_names: Mapping[str, str]) -> pa.Schema:
    """The Arrow schema the lake stores the copy under: the drain's types, the lake's names,
    each field's ``column_metadata``."""
    import pyarrow as pa

    plain = plain_schema(table_info(table))
    described = column_metadata(table, lake_names)
    fields = []
    for field in plain:
        name = lake_names[field.name]
        named = field.with_name(name)
        fields.append(named.with_metadata(described[name]) if described[name] else named)
    return pa.schema(fields)
