"""Server-level facts: version, recovery state, replication settings, current WAL position."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_pglogrepl.hooks.base import Conn, PgSessionHook
from airflow_pglogrepl.hooks.errors import wal_level_error
from airflow_pglogrepl.hooks.pg import server
from airflow_pglogrepl.hooks.pg.server import CURRENT_LSN
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import ServerFacts

# The settings ServerFacts reports; sizes are converted to bytes from pg_settings' unit.
_SETTINGS = (
    "wal_level",
    "max_replication_slots",
    "max_wal_senders",
    "max_logical_replication_workers",
    "max_worker_processes",
    "max_sync_workers_per_subscription",
    "logical_decoding_work_mem",
    "max_slot_wal_keep_size",
    "temp_file_limit",
    "max_active_replication_origins",
    "idle_replication_slot_timeout",
)
_UNIT_BYTES = {"B": 1, "kB": 1024, "8kB": 8192, "MB": 1024**2, "16MB": 16 * 1024**2, "GB": 1024**3}

__all__ = ["CURRENT_LSN", "ServerMixin"]


class ServerMixin(PgSessionHook):
    """Version and settings of the server."""

    def server_facts(self, *, conn: Conn | None = None) -> ServerFacts:
        """Version, recovery state and the replication settings, sizes in bytes."""
        with self._use(conn) as c:
            head = c.execute(
                "SELECT current_setting('server_version_num')::int AS version_num,"
                " current_setting('server_version') AS version,"
                " pg_is_in_recovery() AS in_recovery"
            ).fetchone()
            rows = c.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)",
                (list(_SETTINGS),),
            ).fetchall()
            largest = c.execute(
                "SELECT max(greatest(spill_bytes / nullif(spill_txns, 0),"
                " stream_bytes / nullif(stream_txns, 0)))::int8 AS v"
                " FROM pg_stat_replication_slots"
            ).fetchone()
        assert head is not None
        values = {row["name"]: _setting_value(row["setting"], row["unit"]) for row in rows}
        keep = values.get("max_slot_wal_keep_size")
        temp = values.get("temp_file_limit")
        origins = values.get("max_active_replication_origins")
        idle = next(
            (_seconds(r["setting"], r["unit"]) for r in rows
             if r["name"] == "idle_replication_slot_timeout"),
            None,
        )  # fmt: skip
        return ServerFacts(
            version_num=head["version_num"],
            version=head["version"],
            in_recovery=head["in_recovery"],
            wal_level=str(values["wal_level"]),
            max_replication_slots=int(values["max_replication_slots"]),
            max_wal_senders=int(values["max_wal_senders"]),
            max_logical_replication_workers=int(values["max_logical_replication_workers"]),
            max_worker_processes=int(values["max_worker_processes"]),
            max_sync_workers_per_subscription=int(values["max_sync_workers_per_subscription"]),
            logical_decoding_work_mem=int(values["logical_decoding_work_mem"]),
            max_slot_wal_keep_size=None if keep is None or int(keep) < 0 else int(keep),
            temp_file_limit=None if temp is None or int(temp) < 0 else int(temp),
            largest_decoded_transaction=largest["v"] if largest else None,
            max_active_replication_origins=(None if origins is None else int(origins)),
            idle_replication_slot_timeout_s=idle if idle else None,
        )

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
            row = c.execute(
                "SELECT pg_postmaster_start_time()::text AS started,"
                " current_setting('port') AS port"
            ).fetchone()
        assert row is not None
        return row["started"], row["port"]

    def flush_lsn(self, *, conn: Conn | None = None) -> LSN:
        """WAL flushed to disk: the furthest logical decoding can read (``hooks.pg.server``)."""
        with self._use(conn) as c:
            return server.flush_lsn(c)

    def current_wal_lsn(self, *, conn: Conn | None = None) -> LSN:
        """The server's current WAL write position (replay position on a standby)."""
        with self._use(conn) as c:
            return server.current_wal_lsn(c)


def _setting_value(setting: str, unit: str | None) -> str | int:
    if unit is None:
        return setting
    number = int(setting)
    if number < 0 or unit not in _UNIT_BYTES:
        return number
    return number * _UNIT_BYTES[unit]


_UNIT_SECONDS = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}


def _seconds(setting: str, unit: str | None) -> int:
    """A time setting in whole seconds, whatever unit the server reports it in."""
    return int(int(setting) * _UNIT_SECONDS.get(unit or "s", 1))
