"""The one catalog reader of a table's columns (``pg_attribute``), and what the lake asks of it.

The preflight (types, NOT NULL, identity and generated columns), the snapshot (types as pgoutput
sends them, a domain's base type) and the lake's schema evolution (the value older rows read for
a column added with a default) all read columns through ``columns_json``, so a column is
described the same way wherever it is looked at, and as one model, ``tables.Column``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psycopg import sql

from airflow_pglogrepl.models.records import ColumnOrigin, ColumnOrigins
from airflow_pglogrepl.postgres.connect import Conn
from airflow_pglogrepl.tables import Column, TableRef

# A domain's base type, found the way pgoutput names it in a Type message (getBaseType: down the
# chain of domains to the first type that is not one).
_BASE_TYPE = """
    CROSS JOIN LATERAL (
        WITH RECURSIVE chain(typ, depth) AS (
            SELECT a.atttypid, 0
            UNION ALL
            SELECT t.typbasetype, chain.depth + 1
            FROM chain JOIN pg_catalog.pg_type t ON t.oid = chain.typ
            WHERE t.typtype = 'd')
        SELECT bt.typname::text AS typname, bn.nspname::text AS nspname
        FROM chain
        JOIN pg_catalog.pg_type bt ON bt.oid = chain.typ
        JOIN pg_catalog.pg_namespace bn ON bn.oid = bt.typnamespace
        ORDER BY chain.depth DESC LIMIT 1) AS base"""

# ``attmissingval`` is an ``anyarray`` of one element, read as its array literal and unwrapped by
# ``_sole_element``. (Casting it to text[] split the element at commas, though a type may delimit
# its arrays otherwise: a box default '((2,2),(1,1))' read back as '(2'.)
_MISSING = "CASE WHEN a.atthasmissing THEN a.attmissingval::text END"


def _sole_element(literal: str | None) -> str | None:
    """The one element of an array literal, as its type printed it (None for NULL).

    With one element no delimiter appears, whatever the type's: the element is the literal
    between the braces, double-quoted (with backslash escapes) when it needed quoting.
    """
    if literal is None:
        return None
    inner = literal.strip()[1:-1]
    if inner == "NULL":
        return None
    if inner.startswith('"') and inner.endswith('"'):
        return re.sub(r"\\(.)", r"\1", inner[1:-1])
    return inner


def columns_json(*, base_type: bool = True, missing: bool = False) -> sql.Composable:
    """A scalar subquery giving the columns of the relation aliased ``c`` (``pg_class``) as a
    JSON array in ``attnum`` order, which ``columns_from_json`` reads. ``base_type``: each
    domain's base type (the snapshot needs it; it costs a recursive lookup per column, which the
    preflight spares itself); ``missing``: the value older rows read (the lake's evolution)."""
    fields = """'name', a.attname,
            'type', pg_catalog.format_type(a.atttypid, a.atttypmod),
            'not_null', a.attnotnull,
            'has_default', a.atthasdef,
            'identity', a.attidentity::text,
            'generated', a.attgenerated::text,
            'attnum', a.attnum,
            'type_oid', a.atttypid::bigint,
            'type_modifier', a.atttypmod"""
    if base_type:
        fields += ",\n            'base_namespace', base.nspname, 'base_name', base.typname"
    if missing:
        fields += f",\n            'missing', {_MISSING}"
    return sql.SQL(
        """(SELECT coalesce(jsonb_agg(jsonb_build_object(
            {fields}) ORDER BY a.attnum), '[]'::jsonb)
        FROM pg_catalog.pg_attribute a {base_type}
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)"""
    ).format(fields=sql.SQL(fields), base_type=sql.SQL(_BASE_TYPE if base_type else ""))


def columns_from_json(items: Iterable[Mapping[str, Any]]) -> tuple[Column, ...]:
    """The columns ``columns_json`` gave, as ``Column``."""
    return tuple(
        Column(**{**item, "missing": _sole_element(item["missing"])} if "missing" in item else item)
        for item in items
    )


_TABLE_COLUMNS = sql.SQL(
    """
    SELECT c.relnatts, {columns} AS columns
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s
    """
).format(columns=columns_json(base_type=False, missing=True))


def column_origins(conn: Conn, table: TableRef, names: Sequence[str]) -> ColumnOrigins:
    """``ColumnOrigin`` of each of ``names`` (``exists`` False: dropped or renamed since), and
    the table's ``relnatts`` (0: the table is gone)."""
    row = conn.execute(_TABLE_COLUMNS, (table.schema, table.name)).fetchone()
    found = {} if row is None else {c.name: c for c in columns_from_json(row["columns"])}
    columns = {
        name: ColumnOrigin(name, True, col.missing, col.has_default, col.attnum)
        if (col := found.get(name)) is not None
        else ColumnOrigin(name=name, exists=False)
        for name in names
    }
    return ColumnOrigins(natts=int(row["relnatts"]) if row else 0, columns=columns)
