"""The publication statements, as functions of a psycopg connection: what a publication is as
the server normalised it, its tables and columns, and the DDL that creates, changes or drops it.

Names are composed as identifiers and values bound; a row filter is an SQL expression by nature
and is pasted only after ``check_row_filter`` scanned it (the caller runs the DDL with
``run_ddl``, which keeps it to one statement).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from airflow_pglogrepl.exceptions import UnsupportedFeatureError
from airflow_pglogrepl.models.records import PublicationInfo, PublishedTable
from airflow_pglogrepl.postgres.connect import Conn
from airflow_pglogrepl.row_filter import check_row_filter
from airflow_pglogrepl.tables import TableRef

PUBLISH_OPERATIONS = ("insert", "update", "delete", "truncate")

_MEMBERS_15 = sql.SQL(
    "SELECT n.nspname AS schema, c.relname AS name,"
    " pg_get_expr(pr.prqual, pr.prrelid) AS row_filter,"
    " CASE WHEN pr.prattrs IS NULL THEN NULL ELSE"
    "  (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a"
    "   WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs)) END AS columns"
    " FROM pg_publication_rel pr JOIN pg_class c ON c.oid = pr.prrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE pr.prpubid = %s"
    " ORDER BY 1, 2"
)
_MEMBERS_OLD = sql.SQL(
    "SELECT n.nspname AS schema, c.relname AS name, NULL AS row_filter, NULL AS columns"
    " FROM pg_publication_rel pr JOIN pg_class c ON c.oid = pr.prrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE pr.prpubid = %s ORDER BY 1, 2"
)


def exists(conn: Conn, name: str) -> bool:
    """Whether the connected database has a publication ``name``."""
    found = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
    return found.fetchone() is not None


def publication_tables(conn: Conn, name: str) -> list[TableRef] | None:
    """The tables a publication publishes (``FOR ALL TABLES`` and schemas resolved by the
    server's ``pg_publication_tables``); None when it does not exist."""
    if not exists(conn, name):
        return None
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s"
        " ORDER BY schemaname, tablename",
        (name,),
    ).fetchall()
    return [TableRef(row["schemaname"], row["tablename"]) for row in rows]


def published_columns(
    conn: Conn, names: Sequence[str]
) -> dict[TableRef, list[tuple[str, str, int, int]]]:
    """The tables the publications ``names`` publish, each with its published columns in
    order: ``(name, PostgreSQL type, type oid, type modifier)``."""
    rows = conn.execute(
        "SELECT DISTINCT pt.schemaname, pt.tablename, a.attnum, a.attname::text AS name,"
        " format_type(a.atttypid, a.atttypmod) AS type, a.atttypid::int AS oid,"
        " a.atttypmod AS typmod"
        " FROM pg_publication_tables pt"
        " JOIN pg_namespace n ON n.nspname = pt.schemaname"
        " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
        "  AND NOT a.attisdropped AND a.attname = ANY(pt.attnames)"
        " WHERE pt.pubname = ANY(%s)"
        " ORDER BY pt.schemaname, pt.tablename, a.attnum",
        (list(names),),
    ).fetchall()
    found: dict[TableRef, list[tuple[str, str, int, int]]] = {}
    for row in rows:
        found.setdefault(TableRef(row["schemaname"], row["tablename"]), []).append(
            (row["name"], row["type"], row["oid"], row["typmod"])
        )
    return found


def database_name(conn: Conn) -> str:
    """The connected database's name as the server has it (``current_database()``)."""
    row = conn.execute("SELECT current_database() AS name").fetchone()
    return str(row["name"]) if row else ""


def _version_num(conn: Conn) -> int:
    row = conn.execute("SELECT current_setting('server_version_num')::int AS v").fetchone()
    return int(row["v"]) if row else 0


def read_publication(conn: Conn, name: str) -> PublicationInfo | None:
    """The publication's definition as the server normalised it (row filters as
    ``pg_get_expr`` prints them), or None when it does not exist."""
    pub = conn.execute(
        "SELECT oid, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot"
        " FROM pg_publication WHERE pubname = %s",
        (name,),
    ).fetchone()
    if pub is None:
        return None
    newer = _version_num(conn) >= 150000
    rows = conn.execute(_MEMBERS_15 if newer else _MEMBERS_OLD, (pub["oid"],)).fetchall()
    schemas: list[dict[str, Any]] = []
    if newer:
        schemas = conn.execute(
            "SELECT n.nspname FROM pg_publication_namespace pn"
            " JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE pn.pnpubid = %s ORDER BY 1",
            (pub["oid"],),
        ).fetchall()
    flags = ("pubinsert", "pubupdate", "pubdelete", "pubtruncate")
    return PublicationInfo(
        name=name,
        all_tables=pub["puballtables"],
        publish=tuple(op for op, flag in zip(PUBLISH_OPERATIONS, flags, strict=True) if pub[flag]),
        via_root=pub["pubviaroot"],
        tables=tuple(
            PublishedTable(
                table=TableRef(row["schema"], row["name"]),
                columns=tuple(row["columns"]) if row["columns"] is not None else None,
                row_filter=row["row_filter"],
            )
            for row in rows
        ),
        schemas=tuple(row["nspname"] for row in schemas),
    )


def require_filters_and_column_lists(conn: Conn, name: str) -> None:
    """Row filters and column lists need PostgreSQL 15 on the publisher: refuse clearly."""
    version = _version_num(conn)
    if version < 150000:
        raise UnsupportedFeatureError(
            f"publication {name!r}: row filters and column lists need PostgreSQL 15 or later on "
            f"the publisher (it runs {version or 'unknown'}). Fix: publish whole tables "
            f"and filter downstream, or upgrade the publisher"
        )


def options(publish: Sequence[str], via_root: bool) -> sql.Composable:
    """The ``WITH`` options: what is published (in the server's order) and via which root."""
    ordered = [op for op in PUBLISH_OPERATIONS if op in publish]
    return sql.SQL("publish = {}, publish_via_partition_root = {}").format(
        sql.Literal(", ".join(ordered)), sql.Literal(via_root)
    )


def _table_spec(table: PublishedTable) -> sql.Composable:
    parts: list[sql.Composable] = [sql.Identifier(table.table.schema, table.table.name)]
    if table.columns is not None:
        parts.append(
            sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in table.columns))
        )
    if table.row_filter:
        # A row filter is an SQL expression by nature (trusted DAG-author input, like any SQL
        # operator's text); run_ddl keeps it to this one statement.
        row_filter = check_row_filter(table.row_filter, table=str(table.table))
        parts.append(sql.SQL("WHERE ({})").format(sql.SQL(row_filter)))
    return sql.SQL(" ").join(parts)


def create_statement(
    name: str, tables: Sequence[PublishedTable], all_tables: bool, with_options: sql.Composable
) -> sql.Composed:
    """``CREATE PUBLICATION`` for a table list (columns, row filters) or all tables."""
    target = (
        sql.SQL("FOR ALL TABLES")
        if all_tables
        else sql.SQL("FOR TABLE {}").format(sql.SQL(", ").join(_table_spec(t) for t in tables))
    )
    return sql.SQL("CREATE PUBLICATION {} {} WITH ({})").format(
        sql.Identifier(name), target, with_options
    )


def set_tables_statement(name: str, tables: Sequence[PublishedTable]) -> sql.Composed:
    """``ALTER PUBLICATION ... SET TABLE``: exactly these tables, as given."""
    return sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(
        sql.Identifier(name), sql.SQL(", ").join(_table_spec(t) for t in tables)
    )


def set_options_statement(name: str, with_options: sql.Composable) -> sql.Composed:
    return sql.SQL("ALTER PUBLICATION {} SET ({})").format(sql.Identifier(name), with_options)


def drop_statement(name: str, *, missing_ok: bool) -> sql.Composed:
    return sql.SQL("DROP PUBLICATION {} {}").format(
        sql.SQL("IF EXISTS") if missing_ok else sql.SQL(""), sql.Identifier(name)
    )


def read_literals_as_checked(conn: Conn) -> None:
    """Row filters are pasted into the DDL: their string literals must read as
    ``check_row_filter`` scanned them (with ``standard_conforming_strings`` off, ``'\\''``
    would not end where it did)."""
    conn.execute("SELECT set_config('standard_conforming_strings', 'on', false)")
