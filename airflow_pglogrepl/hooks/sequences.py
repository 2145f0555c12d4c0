"""Sequence values for a cutover: logical replication does not carry them.

The subscriber's sequences stay where the schema copy left them; before the new primary takes
writes, each is set past what the publisher used (``SyncSequencesOperator`` decides by how much).
See https://www.postgresql.org/docs/15/logical-replication-restrictions.html
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.hooks.base import PgSessionHook
from airflow_pglogrepl.models.records import Record
from airflow_pglogrepl.tables import TableRef


@dataclass(frozen=True)
class OwnedSequence(Record):
    """A sequence behind an identity or serial column (``kind``: ``identity`` or ``serial``)."""

    sequence: TableRef
    table: TableRef
    column: str
    kind: str


@dataclass(frozen=True)
class SequenceState(Record):
    """One row of ``pg_sequences``; ``last_value`` is ``None`` until ``nextval`` first ran."""

    sequence: TableRef
    last_value: int | None
    increment: int
    min_value: int
    max_value: int
    # ``last_value`` reads NULL both for a sequence never used and for one the role may not
    # read (it needs SELECT or USAGE): this tells them apart
    readable: bool = True


class SequencesMixin(PgSessionHook):
    """Sequences and the columns they feed."""

    # -- sequences --------------------------------------------------------------------------

    def owned_sequences(self, tables: Sequence[TableRef]) -> list[OwnedSequence]:
        """Sequences behind identity and serial columns of ``tables`` (``pg_depend``)."""
        if not tables:
            return []
        with self.session() as conn:
            rows = conn.execute(
                "SELECT sn.nspname AS seq_schema, s.relname AS seq_name, n.nspname AS schema,"
                " c.relname AS name, a.attname AS column, d.deptype::text AS deptype"
                " FROM unnest(%s::text[], %s::text[]) AS w(schema_name, table_name)"
                " JOIN pg_namespace n ON n.nspname = w.schema_name"
                " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name"
                " JOIN pg_depend d ON d.refobjid = c.oid"
                "  AND d.refclassid = 'pg_class'::regclass AND d.classid = 'pg_class'::regclass"
                "  AND d.deptype IN ('a', 'i')"
                " JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'"
                " JOIN pg_namespace sn ON sn.oid = s.relnamespace"
                " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.refobjsubid"
                " ORDER BY 3, 4, 5",
                ([t.schema for t in tables], [t.name for t in tables]),
            ).fetchall()
        return [
            OwnedSequence(
                sequence=TableRef(row["seq_schema"], row["seq_name"]),
                table=TableRef(row["schema"], row["name"]),
                column=row["column"],
                kind="identity" if row["deptype"] == "i" else "serial",
            )
            for row in rows
        ]

    def sequence_states(self, sequences: Sequence[TableRef]) -> dict[TableRef, SequenceState]:
        """``pg_sequences`` rows of ``sequences`` that exist (``last_value`` needs SELECT)."""
        if not sequences:
            return {}
        with self.session() as conn:
            rows = conn.execute(
                "SELECT q.schemaname, q.sequencename, q.last_value, q.increment_by, q.min_value,"
                " q.max_value, has_sequence_privilege(format('%%I.%%I', q.schemaname,"
                " q.sequencename), 'SELECT, USAGE') AS readable"
                " FROM unnest(%s::text[], %s::text[]) AS w(schema_name, seq_name)"
                " JOIN pg_sequences q ON q.schemaname = w.schema_name"
                " AND q.sequencename = w.seq_name",
                ([s.schema for s in sequences], [s.name for s in sequences]),
            ).fetchall()
        return {
            TableRef(row["schemaname"], row["sequencename"]): SequenceState(
                sequence=TableRef(row["schemaname"], row["sequencename"]),
                last_value=row["last_value"],
                increment=row["increment_by"],
                min_value=row["min_value"],
                max_value=row["max_value"],
                readable=row["readable"],
            )
            for row in rows
        }

    def column_max(self, table: TableRef, column: str) -> int | None:
        """``max(column)`` of ``table`` (an integer column), ``None`` when the table is empty."""
        with self.session() as conn:
            row = conn.execute(
                sql.SQL("SELECT max({})::numeric AS v FROM {}").format(
                    sql.Identifier(column), sql.Identifier(table.schema, table.name)
                )
            ).fetchone()
        return None if row is None or row["v"] is None else int(row["v"])

    def set_sequence(self, sequence: TableRef, value: int) -> None:
        """``setval(sequence, value, true)``: the next ``nextval`` returns ``value`` + increment."""
        with self.session() as conn:
            row = conn.execute(
                "SELECT setval(c.oid, %s, true) AS v FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'S'",
                (value, sequence.schema, sequence.name),
            ).fetchone()
        if row is None:
            raise ObjectNotFoundError("sequence", str(sequence), "check the sequence name")
        self.log.info("setval(%s, %d)", sequence, value)
