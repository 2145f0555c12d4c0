"""What the catalog says about columns the lake meets for the first time (after ``ADD COLUMN``)."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_pglogrepl.hooks.pg.connect import Conn
from airflow_pglogrepl.hooks.records import ColumnOrigin, ColumnOrigins
from airflow_pglogrepl.tables import TableRef

# ``attmissingval`` is an ``anyarray`` of one element; going through text[] gives that element as
# the type's own output function prints it, whatever the column's type (arrays included).
_ORIGINS = sql.SQL(
    """
    SELECT a.attname AS name,
           CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END AS missing,
           a.atthasdef AS has_default, a.attnum
    FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
      AND a.attname = ANY(%s)
    """
)


_NATTS = sql.SQL(
    """
    SELECT c.relnatts FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s
    """
)


def column_origins(conn: Conn, table: TableRef, names: Sequence[str]) -> ColumnOrigins:
    """``ColumnOrigin`` of each of ``names`` (``exists`` False: dropped or renamed since), and
    the table's ``relnatts`` (0: the table is gone)."""
    head = conn.execute(_NATTS, (table.schema, table.name)).fetchone()
    rows = conn.execute(_ORIGINS, (table.schema, table.name, list(names))).fetchall()
    found = {
        r["name"]: ColumnOrigin(r["name"], True, r["missing"], bool(r["has_default"]), r["attnum"])
        for r in rows
    }
    columns = {name: found.get(name, ColumnOrigin(name=name, exists=False)) for name in names}
    return ColumnOrigins(natts=int(head["relnatts"]) if head else 0, columns=columns)
