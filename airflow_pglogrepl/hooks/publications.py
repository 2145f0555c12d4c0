"""Publications on the publisher: read, create, reconcile, drop."""

from __future__ import annotations

from airflow_pglogrepl.hooks.base import Conn, PgSessionHook
from airflow_pglogrepl.tables import TableRef


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
