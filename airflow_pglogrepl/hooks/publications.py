"""Publications on the publisher: read, create, reconcile, drop (the statements:
``postgres/publications.py``).

Reconciling relies on PostgreSQL's transactional DDL: the desired definition is applied inside a
transaction and read back as the server normalises it (row filters as ``pg_get_expr`` prints
them), then committed only if it differs from what was there. So re-running a task with the same
definition changes nothing, however the DAG author spelled the row filter.
See https://www.postgresql.org/docs/15/sql-alterpublication.html
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import DefinitionConflictError
from airflow_pglogrepl.hooks.base import Conn, PgSessionHook, run_ddl, show
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import PublicationInfo, PublishedTable, Reconciled
from airflow_pglogrepl.postgres import publications
from airflow_pglogrepl.postgres.coverage import SourceCoverage, publication_coverage
from airflow_pglogrepl.postgres.errors import WAL_LEVEL_FIX
from airflow_pglogrepl.postgres.publications import PUBLISH_OPERATIONS
from airflow_pglogrepl.tables import TableRef

__all__ = ["PUBLISH_OPERATIONS", "PublicationsMixin"]


class PublicationsMixin(PgSessionHook):
    """Publications of the connected database."""

    def publication_tables(self, name: str, *, conn: Conn | None = None) -> list[TableRef] | None:
        """The tables a publication publishes (resolving ``FOR ALL TABLES`` and schemas).

        ``None`` when the publication does not exist.
        """
        with self._use(conn) as c:
            return publications.publication_tables(c, name)

    def published_columns(
        self, names: Sequence[str], *, conn: Conn | None = None
    ) -> dict[TableRef, list[tuple[str, str, int, int]]]:
        """The tables the publications ``names`` publish, each with its published columns in
        order: ``(name, PostgreSQL type, type oid, type modifier)`` (what lineage reports)."""
        with self._use(conn) as c:
            return publications.published_columns(c, names)

    def database_name(self, *, conn: Conn | None = None) -> str:
        """The connected database's name as the server has it (``current_database()``): a
        connection's ``dbname`` may be a whole connection URI, with its password."""
        with self._use(conn) as c:
            return publications.database_name(c)

    def source_identity(self) -> dict[str, object]:
        """The server's system identifier, timeline and the database (see
        ``postgres.server.source_identity``)."""
        from airflow_pglogrepl.postgres.server import source_identity

        with self.session() as conn:
            return source_identity(conn)

    def switch_points(self, timeline: int) -> dict[int, LSN]:
        """The ancestors of ``timeline`` on the server, each with the LSN where its history left
        it (``postgres.timelines``)."""
        from airflow_pglogrepl.postgres.timelines import switch_points

        with self.session(replication=True) as conn:
            return switch_points(conn, timeline)

    def absent_standby_slots(self) -> list[str]:
        """``postgres.failover.absent_standby_slots``: what a failover slot's reads wait for."""
        from airflow_pglogrepl.postgres.failover import absent_standby_slots

        with self.session() as conn:
            return absent_standby_slots(conn)

    def missing_publications(self, names: Sequence[str]) -> list[str]:
        """The ``names`` no publication of the connected database has."""
        from airflow_pglogrepl.postgres.server import missing_publications

        with self.session() as conn:
            return missing_publications(conn, names)

    def publication_coverage(self, names: Sequence[str], *,
                             known: Collection[int] | None = None) -> SourceCoverage:  # fmt: skip
        """Every relation ``names`` publish now, with its leaves and whether each was born
        published (``postgres.coverage``; ``known``: the OIDs the lake records, those not
        among them read for rows older than their publication): what the drain compares the
        lake with."""
        with self.session() as conn:
            return publication_coverage(conn, names, known=known)

    def require_publications(
        self, names: Sequence[str], *, slot: str | None = None, consequence: str
    ) -> None:
        """Raise ``PublicationNotFoundError`` when a publication of ``names`` does not exist in
        the connected database: the ones that do are listed, the closest suggested.
        ``consequence`` says what was not done because of it."""
        from airflow_pglogrepl.exceptions import PublicationNotFoundError
        from airflow_pglogrepl.postgres.server import missing_publications, publication_names

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
            return publications.read_publication(c, name)

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
            publications.read_literals_as_checked(conn)
            wal_level = show(conn, "wal_level")
            before = publications.read_publication(conn, name)
            if any(t.columns is not None or t.row_filter for t in tables):
                publications.require_filters_and_column_lists(conn, name)
            options = publications.options(publish, via_root)
            if before is None:
                run_ddl(conn, publications.create_statement(name, tables, all_tables, options))
                conn.commit()
                action, details = "created", tuple(f"+ {t.table}" for t in tables)
            else:
                _check_compatible(before, all_tables)
                if tables:
                    run_ddl(conn, publications.set_tables_statement(name, tables))
                run_ddl(conn, publications.set_options_statement(name, options))
                after = publications.read_publication(conn, name)
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
        with self.session() as conn:
            found = publications.exists(conn, name)
            run_ddl(conn, publications.drop_statement(name, missing_ok=missing_ok))
        self.log.info("Publication %s %s", name, "dropped" if found else "did not exist")
        return found


def _check_publish(name: str, publish: Sequence[str]) -> None:
    unknown = [op for op in publish if op not in PUBLISH_OPERATIONS]
    if unknown or not publish:
        raise ValueError(
            f"publication {name!r}: publish must be a non-empty subset of {PUBLISH_OPERATIONS}, "
            f"got {list(publish)!r}"
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
