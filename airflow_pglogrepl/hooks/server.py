"""Server-level facts: version, recovery state, replication settings, current WAL position."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_pglogrepl.hooks.base import Conn, PgSessionHook
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import ServerFacts
from airflow_pglogrepl.postgres import server
from airflow_pglogrepl.postgres.errors import wal_level_error
from airflow_pglogrepl.postgres.server import CURRENT_LSN

__all__ = ["CURRENT_LSN", "ServerMixin"]


class ServerMixin(PgSessionHook):
    """Version and settings of the server."""

    def server_facts(self, *, conn: Conn | None = None) -> ServerFacts:
        """Version, recovery state and the replication settings, sizes in bytes
        (``postgres.server.server_facts``)."""
        with self._use(conn) as c:
            return server.server_facts(c)

    def require_logical_decoding(self, *, conn: Conn | None = None) -> ServerFacts:
        """Server facts, or ``ServerNotConfiguredError`` naming ``wal_level`` when not logical."""
        facts = self.server_facts(conn=conn)
        if facts.wal_level != "logical":
            params = self.connection_params()
            where = f"{params.get('host', 'localhost')}:{params.get('port', '5432')}"
            raise wal_level_error(facts.wal_level, where)
        return facts

    def require_slot_privileges(
        self, *, reads: Sequence[str] = (), conn: Conn | None = None
    ) -> None:
        """Raise ``PrivilegeError`` unless the role may use replication slots (REPLICATION or
        superuser: peek, advance, create) and, for a copy, SELECT every table the ``reads``
        publications publish. Checked before a drain or snapshot starts, so a role short of a
        privilege fails in milliseconds, before anything is done, not after spark-submit."""
        from psycopg import sql

        from airflow_pglogrepl.exceptions import PrivilegeError

        with self._use(conn) as c:
            role = server.role_attributes(c)
            name = str(role["role"])
            if not (role["superuser"] or role["replication"]):
                ident = sql.Identifier(name).as_string(c)
                raise PrivilegeError(
                    name, "use replication slots (a drain peeks and advances its slot, a "
                    "snapshot creates it)",
                    f"as a superuser, ALTER ROLE {ident} REPLICATION",
                )  # fmt: skip
            unreadable = server.unreadable_published_tables(c, reads) if reads else []
            if unreadable:
                shown = ", ".join(
                    sql.SQL("{}.{}").format(sql.Identifier(s), sql.Identifier(t)).as_string(c)
                    for s, t in unreadable
                )
                raise PrivilegeError(
                    name, f"SELECT {len(unreadable)} published table(s) the snapshot copies: "
                    f"{shown}",
                    f"GRANT SELECT ON {shown} TO {sql.Identifier(name).as_string(c)}",
                )  # fmt: skip

    def instance_identity(self, *, conn: Conn | None = None) -> tuple[str, str]:
        """(postmaster start time, port): equal for two connections to one running server.

        Publisher and subscriber on one instance need special handling (the slot must exist
        before ``CREATE SUBSCRIPTION``, or it waits for itself). These two need no privilege,
        unlike ``pg_control_system()``, and tell instances apart even when reached through
        different host names.
        """
        with self._use(conn) as c:
            return server.instance_identity(c)

    def flush_lsn(self, *, conn: Conn | None = None) -> LSN:
        """WAL flushed to disk: the furthest logical decoding can read (``postgres.server``)."""
        with self._use(conn) as c:
            return server.flush_lsn(c)

    def current_wal_lsn(self, *, conn: Conn | None = None) -> LSN:
        """The server's current WAL write position (replay position on a standby)."""
        with self._use(conn) as c:
            return server.current_wal_lsn(c)
