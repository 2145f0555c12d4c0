"""A table's changelog as its history reads it: columns, key and identity, rows by range.

The history takes everything it knows of a table from its changelog's schema (the key and the
replica identity are marked there, as the state merge reads them), and its rows in a range of
commit LSNs under today's column names; ``reduce`` turns them into versions by the table's
kind (keyed or no identity: ``merge.history_versions``; REPLICA IDENTITY FULL:
``merge.history_copies``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    COMMIT_TS,
    META_COLUMNS,
    OLD,
    OP,
    SEQ,
    UNCHANGED,
    described_identity,
    described_key,
)
from airflow_pglogrepl.changelog.history_columns import history_fields, history_schema
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.column_names import former_names, with_current_names
from airflow_pglogrepl.lake.evolve import added_at, base_fields, fill_value
from airflow_pglogrepl.merge.changes_range import InRange
from airflow_pglogrepl.merge.history_copies import copies_versions
from airflow_pglogrepl.merge.history_versions import Prior, Versions, versions

if TYPE_CHECKING:
    import pyarrow as pa


class TableChanges:
    """``changes/<table>`` read for its history: ``columns`` (the table's own), ``keys``
    (empty: none), ``full`` (REPLICA IDENTITY FULL), ``types`` (the history's schema as the
    changelog would make it)."""

    def __init__(self, changes: Any) -> None:
        import pyarrow as pa

        self.changes = changes
        self.schema = delta.unmapped(pa.schema(changes.schema().to_arrow()))
        fields = [(f.name, _text(f.metadata)) for f in self.schema]
        self.full = described_identity(fields) == "f"
        self.keys = [] if self.full else described_key(fields)
        self.columns = [n for n, _ in fields if n not in META_COLUMNS]
        self.types = history_schema(pa.schema([self.schema.field(c) for c in self.columns]))

    @property
    def read_columns(self) -> list[str]:
        """The changelog columns a reduction reads (not the transaction id ...)."""
        wanted = [*self.columns, OP, COMMIT_LSN, SEQ, COMMIT_TS, UNCHANGED, OLD]
        return [c for c in wanted if c in self.schema.names]

    def size_bytes(self, have: int | None, end: int) -> int:
        """About how many Arrow bytes ``read`` would hold (``InRange.size_bytes``)."""
        return InRange(self.changes, self.schema, have, end).size_bytes(self.read_columns)

    def read(self, have: int | None, end: int) -> pa.Table:
        """The changelog's rows with ``have <= _commit_lsn < end``, columns by today's names."""
        import pyarrow as pa

        in_range = InRange(self.changes, self.schema, have, end)
        batch = with_current_names(in_range.read(self.read_columns), former_names(self.schema))
        batch = with_fills(batch, self.schema)
        if COMMIT_TS not in batch.column_names:  # (a changelog from before commit times)
            stamp = history_fields()[2].type
            batch = batch.append_column(COMMIT_TS, pa.nulls(batch.num_rows, stamp))
        return batch

    def reduce(self, batch: pa.Table, prior: Prior, stored: pa.Schema | None = None) -> Versions:
        """The versions ``batch`` makes, against the history's current ones (``prior``)."""
        types = self.types if stored is None else stored
        if self.full:
            return copies_versions(batch, self.columns, prior, types)
        return versions(batch, self.columns, self.keys, prior=prior, types=types)


def fills(schema: pa.Schema) -> dict[str, tuple[tuple[int, int], Any]]:
    """The columns added with a value for the rows from before them (``ADD COLUMN ... DEFAULT
    7``): name -> (where the first change carrying it is, the value)."""
    found = {}
    for field in base_fields(schema):
        at, value = added_at(field), fill_value(field)
        if at is not None and value is not None:
            found[field.name] = (at, value)
    return found


def with_fills(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    """Changelog rows from before a column was added hold its fill there (and in their old row),
    as PostgreSQL's rows do; the state's merge reads them alike (``materialize.with_fills``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, ((lsn, seq), value) in fills(schema).items():
        if name not in batch.column_names or batch.num_rows == 0:
            continue
        lsns, seqs = batch.column(COMMIT_LSN), batch.column(SEQ)
        before = pc.or_(pc.less(lsns, lsn), pc.and_(pc.equal(lsns, lsn), pc.less(seqs, seq)))
        before = before.combine_chunks()
        kind = batch.schema.field(name).type
        filled = pc.if_else(before, pa.scalar(value, kind), batch.column(name).combine_chunks())
        batch = batch.set_column(batch.column_names.index(name), batch.schema.field(name), filled)
        if OLD in batch.column_names and name in batch.schema.field(OLD).type.names:
            old = batch.column(OLD).combine_chunks()
            children = [pc.if_else(before, pa.scalar(value, child.type), child)
                        if field.name == name else child
                        for field, child in zip(old.type, old.flatten(), strict=True)]  # fmt: skip
            rebuilt = pa.StructArray.from_arrays(children, fields=list(old.type),
                                                 mask=pc.is_null(old))  # fmt: skip
            batch = batch.set_column(batch.column_names.index(OLD), batch.schema.field(OLD),
                                     rebuilt)  # fmt: skip
    return batch


def conformed(rows: pa.Table, stored: pa.Schema) -> pa.Table:
    """``rows`` in ``stored``'s column order and types; a column they lack (dropped at the
    source, or only in the key and ending columns of versions to end) NULL."""
    import pyarrow as pa

    arrays = [rows.column(f.name).cast(f.type) if f.name in rows.column_names
              else pa.nulls(rows.num_rows, f.type) for f in stored]  # fmt: skip
    return pa.table(arrays, schema=stored)


def _text(metadata: dict[bytes, bytes] | None) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (metadata or {}).items()}
