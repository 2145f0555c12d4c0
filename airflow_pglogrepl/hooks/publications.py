"""Publications on the publisher: read, create, reconcile, drop.

Reconciling relies on PostgreSQL's transactional DDL: the desired definition is applied inside a
transaction and read back as the server normalises it (row filters as ``pg_get_expr`` prints
them), then committed only if it differs from what was there. So re-running a task with the same
definition changes nothing, however the DAG author spelled the row filter.
See https://www.postgresql.org/docs/15/sql-alterpublication.html
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import DefinitionConflictError, UnsupportedFeatureError
from airflow_pglogrepl.hooks.base import Conn, PgSessionHook, run_ddl, show
from airflow_pglogrepl.hooks.errors import WAL_LEVEL_FIX
from airflow_pglogrepl.models.records import PublicationInfo, PublishedTable, Reconciled
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


class PublicationsMixin(PgSessionHook):
    """Publications of the connected database."""

    def publication_tables(self, name: str, *, conn: Conn | None = None) -> list[TableRef] | None:
        """The tables a publication publishes (resolving ``FOR ALL TABLES`` and schemas).

        ``None`` when the publication does not exist.
        """
        with self._use(conn) as c:
            exists = c.execute(
                "SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)
            ).fetchone()
            if exists is None:
                return None
            rows = c.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s"
                " ORDER BY schemaname, tablename",
                (name,),
            ).fetchall()
        return [TableRef(row["schemaname"], row["tablename"]) for row in rows]

    def published_columns(
        self, names: Sequence[str], *, conn: Conn | None = None
    ) -> dict[TableRef, list[tuple[str, str, int, int]]]:
        """The tables the publications ``names`` publish, each with its published columns in
        order: ``(name, PostgreSQL type, type oid, type modifier)`` (what lineage reports)."""
        with self._use(conn) as c:
            rows = c.execute(
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

    def database_name(self, *, conn: Conn | None = None) -> str:
        """The connected database's name as the server has it (``current_database()``): a
        connection's ``dbname`` may be a whole connection URI, with its password."""
        with self._use(conn) as c:
            row = c.execute("SELECT current_database() AS name").fetchone()
        return str(row["name"]) if row else ""

    def source_identity(self) -> dict[str, object]:
        """The server's system identifier, timeline and the database (see
        ``hooks.pg.server.source_identity``)."""
        from airflow_pglogrepl.hooks.pg.server import source_identity

        with self.session() as conn:
            return source_identity(conn)

    def missing_publications(self, names: Sequence[str]) -> list[str]:
        """The ``names`` no publication of the connected database has."""
        from airflow_pglogrepl.hooks.pg.server import missing_publications

        with self.session() as conn:
            return missing_publications(conn, names)

    def require_publications(
        self, names: Sequence[str], *, slot: str | None = None, consequence: str
    ) -> None:
        """Raise ``PublicationNotFoundError`` when a publication of ``names`` does not exist in
        the connected database: the ones that do are listed, the closest suggested.
        ``consequence`` says what was not done because of it."""
        from airflow_pglogrepl.exceptions import PublicationNotFoundError
        from airflow_pglogrepl.hooks.pg.server import missing_publications, publication_names

        with self.session() as conn:
            missing = missing_publications(conn, names)
            if not missing:
                return
            existing = publication_names(conn)
        raise PublicationNotFoundError(
            missing, slot, existing=existing, consequence=consequence,
            server=f"PostgreSQL {conninfo.describe(self.connection_params())}",
        )  # fmt: skip

    def get_publication(self, name: str, *, conn: Conn | None = None) -> PublicationInfo | None:
        """The publication's definition, or ``None`` when it does not exist."""
        with self._use(conn) as c:
            return _read_publication(c, name)

    def ensure_publication(
        self,
        name: str,
        *,
        tables: Sequence[PublishedTable] = (),
        all_tables: bool = False,
        publish: Sequence[str] = PUBLISH_OPERATIONS,
        via_root: bool = False,
    ) -> Reconciled:
        """Create the publication, or make an existing one match; a no-op when it already does.

        Tables are added or dropped to match; options are set. A publication that is
        ``FOR ALL TABLES`` when a list is asked for (or the reverse), or that publishes whole
        schemas, raises ``DefinitionConflictError``: changing that means dropping it.
        """
        _check_publish(name, publish)
        if all_tables == bool(tables):
            raise ValueError(
                f"publication {name!r}: give a table list, or all_tables=True without tables"
            )
        with self.session(autocommit=False) as conn:
            # row filters are pasted into the DDL: their literals must read as check_row_filter
            # scanned them (with standard_conforming_strings off, '\'' would not end there)
            conn.execute("SELECT set_config('standard_conforming_strings', 'on', false)")
            wal_level = show(conn, "wal_level")
            before = _read_publication(conn, name)
            if any(t.columns is not None or t.row_filter for t in tables):
                _require_15(conn, name)
            options = _options(publish, via_root)
            if before is None:
                run_ddl(conn, _create_statement(name, tables, all_tables, options))
                conn.commit()
                action, details = "created", tuple(f"+ {t.table}" for t in tables)
            else:
                _check_compatible(before, all_tables)
                if tables:
                    run_ddl(conn, _set_tables_statement(name, tables))
                run_ddl(
                    conn,
                    sql.SQL("ALTER PUBLICATION {} SET ({})").format(sql.Identifier(name), options),
                )
                after = _read_publication(conn, name)
                assert after is not None
                details = _differences(before, after)
                if details:
                    conn.commit()
                    action = "changed"
                else:
                    conn.rollback()
                    action = "unchanged"
        result = Reconciled("publication", name, action, details)
        self.log.info("Publication %s %s%s", name, action, "".join(f"\n  {d}" for d in details))
        if wal_level != "logical":
            self.log.warning(
                "Publication %s is defined, but PostgreSQL %s publishes nothing yet: its "
                "wal_level is %r, and a subscription or slot on it is refused. Fix: %s",
                name, conninfo.describe(self.connection_params()), wal_level, WAL_LEVEL_FIX,
            )  # fmt: skip
        return result

    def drop_publication(self, name: str, *, missing_ok: bool = True) -> bool:
        """Drop the publication; False when it did not exist (and ``missing_ok``)."""
        statement = sql.SQL("DROP PUBLICATION {} {}").format(
            sql.SQL("IF EXISTS") if missing_ok else sql.SQL(""), sql.Identifier(name)
        )
        with self.session() as conn:
            existed = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
            found = existed.fetchone() is not None
            run_ddl(conn, statement)
        self.log.info("Publication %s %s", name, "dropped" if found else "did not exist")
        return found


def _check_publish(name: str, publish: Sequence[str]) -> None:
    unknown = [op for op in publish if op not in PUBLISH_OPERATIONS]
    if unknown or not publish:
        raise ValueError(
            f"publication {name!r}: publish must be a non-empty subset of {PUBLISH_OPERATIONS}, "
            f"got {list(publish)!r}"
        )


def _require_15(conn: Conn, name: str) -> None:
    row = conn.execute("SELECT current_setting('server_version_num')::int AS v").fetchone()
    if row is None or row["v"] < 150000:
        raise UnsupportedFeatureError(
            f"publication {name!r}: row filters and column lists need PostgreSQL 15 or later on "
            f"the publisher (it runs {row['v'] if row else 'unknown'}). Fix: publish whole tables "
            f"and filter downstream, or upgrade the publisher"
        )


def _options(publish: Sequence[str], via_root: bool) -> sql.Composable:
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


def _create_statement(
    name: str, tables: Sequence[PublishedTable], all_tables: bool, options: sql.Composable
) -> sql.Composed:
    target = (
        sql.SQL("FOR ALL TABLES")
        if all_tables
        else sql.SQL("FOR TABLE {}").format(sql.SQL(", ").join(_table_spec(t) for t in tables))
    )
    return sql.SQL("CREATE PUBLICATION {} {} WITH ({})").format(
        sql.Identifier(name), target, options
    )


def _set_tables_statement(name: str, tables: Sequence[PublishedTable]) -> sql.Composed:
    return sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(
        sql.Identifier(name), sql.SQL(", ").join(_table_spec(t) for t in tables)
    )


def _check_compatible(before: PublicationInfo, all_tables: bool) -> None:
    if before.all_tables and not all_tables:
        raise DefinitionConflictError(
            "publication",
            before.name,
            "is FOR ALL TABLES while this task asks for a table list",
            "drop it first (DropPublicationOperator) or set all_tables=True",
        )
    if all_tables and not before.all_tables:
        raise DefinitionConflictError(
            "publication",
            before.name,
            f"publishes a table list ({len(before.tables)} tables) while this task asks for "
            f"FOR ALL TABLES",
            "drop it first (DropPublicationOperator) or give the table list",
        )
    if before.schemas:
        raise DefinitionConflictError(
            "publication",
            before.name,
            f"publishes whole schemas ({', '.join(before.schemas)}), which this task does not "
            f"manage",
            "drop it first or give it another name",
        )


def _differences(before: PublicationInfo, after: PublicationInfo) -> tuple[str, ...]:
    old = {t.table: t for t in before.tables}
    new = {t.table: t for t in after.tables}
    details = [f"+ {t}" for t in sorted(new.keys() - old.keys())]
    details += [f"- {t}" for t in sorted(old.keys() - new.keys())]
    details += [
        f"~ {t}: columns {_cols(old[t])} -> {_cols(new[t])}, "
        f"filter {old[t].row_filter!r} -> {new[t].row_filter!r}"
        for t in sorted(old.keys() & new.keys())
        if old[t] != new[t]
    ]
    if before.publish != after.publish:
        details.append(f"publish {','.join(before.publish)} -> {','.join(after.publish)}")
    if before.via_root != after.via_root:
        details.append(f"publish_via_partition_root {before.via_root} -> {after.via_root}")
    return tuple(details)


def _cols(table: PublishedTable) -> str:
    return "all" if table.columns is None else ",".join(table.columns)


def _read_publication(conn: Conn, name: str) -> PublicationInfo | None:
    pub = conn.execute(
        "SELECT oid, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot"
        " FROM pg_publication WHERE pubname = %s",
        (name,),
    ).fetchone()
    if pub is None:
        return None
    version = conn.execute("SELECT current_setting('server_version_num')::int AS v").fetchone()
    newer = version is not None and version["v"] >= 150000
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
