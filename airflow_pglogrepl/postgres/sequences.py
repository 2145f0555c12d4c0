"""The statements on sequences a cutover runs, as functions of a psycopg connection: which
sequences feed a table's identity and serial columns, their values, and moving them past what
the publisher used (logical replication does not carry sequences).
See https://www.postgresql.org/docs/15/logical-replication-restrictions.html
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_pglogrepl.models.records import OwnedSequence, SequenceState
from airflow_pglogrepl.postgres.connect import Conn
from airflow_pglogrepl.tables import TableRef


def owned_sequences(conn: Conn, tables: Sequence[TableRef]) -> list[OwnedSequence]:
    """Sequences behind identity and serial columns of ``tables`` (``pg_depend``)."""
    if not tables:
        return []
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


def sequence_states(conn: Conn, sequences: Sequence[TableRef]) -> dict[TableRef, SequenceState]:
    """``pg_sequences`` rows of ``sequences`` that exist (``last_value`` needs SELECT)."""
    if not sequences:
        return {}
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


def column_max(conn: Conn, table: TableRef, column: str) -> int | None:
    """``max(column)`` of ``table`` (an integer column), ``None`` when the table is empty."""
    row = conn.execute(
        sql.SQL("SELECT max({})::numeric AS v FROM {}").format(
            sql.Identifier(column), sql.Identifier(table.schema, table.name)
        )
    ).fetchone()
    return None if row is None or row["v"] is None else int(row["v"])


def set_sequence(conn: Conn, sequence: TableRef, value: int) -> bool:
    """``setval(sequence, value, true)``: the next ``nextval`` returns ``value`` + increment.
    False: no sequence of that name."""
    row = conn.execute(
        "SELECT setval(c.oid, %s, true) AS v FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'S'",
        (value, sequence.schema, sequence.name),
    ).fetchone()
    return row is not None
