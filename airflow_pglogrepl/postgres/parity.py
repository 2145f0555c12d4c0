"""The statements of the cutover's parity check, as functions of a psycopg connection: a
table's replicated columns and its checksum, read the same way on both servers."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_pglogrepl.models.records import TableChecksum
from airflow_pglogrepl.postgres.connect import TEXT_OUTPUT, Conn, set_session
from airflow_pglogrepl.tables import TableRef

# Row text must read the same on both servers: fix every setting that changes a type's output.
STABLE_OUTPUT = {**TEXT_OUTPUT, "lc_monetary": "C"}


def table_columns(conn: Conn, tables: Sequence[TableRef]) -> dict[TableRef, tuple[str, ...]]:
    """Replicated columns of each table that exists, in column order.

    Dropped and generated columns are left out: logical replication does not carry generated
    values (PostgreSQL 15), the subscriber computes its own.
    """
    if not tables:
        return {}
    rows = conn.execute(
        "SELECT n.nspname AS schema, c.relname AS name,"
        " coalesce(array_agg(a.attname::text ORDER BY a.attnum)"
        "  FILTER (WHERE a.attnum IS NOT NULL), '{}') AS columns"
        " FROM unnest(%s::text[], %s::text[]) AS w(schema_name, table_name)"
        " JOIN pg_namespace n ON n.nspname = w.schema_name"
        " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name"
        "  AND c.relkind IN ('r', 'p')"
        " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
        "  AND NOT a.attisdropped AND a.attgenerated = ''"
        " GROUP BY 1, 2",
        ([t.schema for t in tables], [t.name for t in tables]),
    ).fetchall()
    return {TableRef(row["schema"], row["name"]): tuple(row["columns"]) for row in rows}


def table_checksum(conn: Conn, table: TableRef, columns: Sequence[str]) -> TableChecksum:
    """Row count and the sum of each row's md5 folded to a signed 64-bit integer.

    Summing (not XOR) keeps duplicate rows from cancelling out, and md5 of the row's text form
    is the same on every platform (``hashtext`` differs between byte orders). The session is
    set to fix what changes text output (time zone, date and interval style, float digits,
    bytea, money), so equal rows give equal text on both servers; columns are listed by name,
    so column order on the two sides does not matter.
    """
    row_text = sql.SQL("ROW({})::text").format(
        sql.SQL(", ").join(sql.Identifier("t", c) for c in columns)
    )
    query = sql.SQL(
        "SELECT count(*) AS rows, coalesce(sum(('x' || left(md5({}), 16))::bit(64)::bigint"
        "::numeric), 0) AS checksum FROM {} AS t"
    ).format(row_text, sql.Identifier(table.schema, table.name))
    set_session(conn, STABLE_OUTPUT)
    row = conn.execute(query).fetchone()
    assert row is not None
    return TableChecksum(rows=int(row["rows"]), checksum=int(row["checksum"]))
