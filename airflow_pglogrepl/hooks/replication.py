"""``PgLogicalReplicationHook``: the one place in the project that speaks SQL to PostgreSQL.

Operators, sensors and the Spark applications call methods here; none of them compose
statements. Every identifier goes through ``psycopg.sql.Identifier`` and every value is a bound
parameter, so hostile names are data, never SQL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from airflow.providers.postgres.hooks.postgres import PostgresHook
from psycopg import sql
from psycopg.rows import dict_row, tuple_row

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import (
    ConnectionFailedError,
    SlotAdvanceError,
    SlotNotFoundError,
    WrongPluginError,
)
from airflow_pglogrepl.hooks.errors import slot_errors, wal_level_error
from airflow_pglogrepl.hooks.lsn_adapters import register_lsn_adapters
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.names import validate_slot_name
from airflow_pglogrepl.records import ServerFacts, SlotCreated, SlotInfo

OUTPUT_PLUGINS = ("pgoutput", "test_decoding", "wal2json")

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
)
_UNIT_BYTES = {"B": 1, "kB": 1024, "8kB": 8192, "MB": 1024**2, "16MB": 16 * 1024**2, "GB": 1024**3}

# Where the server's WAL is now; on a standby (PostgreSQL 16+ can decode there) the replay point.
_CURRENT_LSN = sql.SQL(
    "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"
)
# to_jsonb(s) keeps this one query valid across versions: columns added later (inactive_since in
# 17, two_phase in 14) are simply absent on older servers.
_SLOTS_QUERY = sql.SQL(
    "SELECT to_jsonb(s) AS slot, {lsn} AS current_lsn,"
    " pg_wal_lsn_diff({lsn}, s.restart_lsn)::bigint AS retained_bytes"
    " FROM pg_replication_slots s"
).format(lsn=_CURRENT_LSN)


class PgLogicalReplicationHook(PostgresHook):
    """Logical replication on one PostgreSQL server, through an Airflow Postgres connection.

    Takes the same connections as ``PostgresHook`` (``conn_type`` ``postgres`` or
    ``pglogrepl``); libpq extras such as ``sslmode`` pass through. Each method opens a short
    autocommit session unless given ``conn=`` (needed for temporary slots, which live only as long
    as the session that created them).

    :param postgres_conn_id: the Airflow connection id.
    :param database: overrides the connection's database (slots belong to one database).
    """

    conn_type = "pglogrepl"
    hook_name = "PostgreSQL logical replication"

    # -- sessions -------------------------------------------------------------------------

    def connection_params(self) -> dict[str, str]:
        """libpq keyword parameters for this hook's connection (contains the password)."""
        conn = self.connection
        login, password, port = conn.login, conn.password, conn.port
        if conn.extra_dejson.get("iam", False):
            login, password, port = self.get_iam_token(conn)
        return conninfo.libpq_params(
            host=conn.host,
            port=port,
            user=login,
            password=password,
            dbname=self.database or conn.schema,
            extra=conn.extra_dejson,
        )

    @contextmanager
    def session(
        self, *, replication: bool = False, autocommit: bool = True
    ) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """An open psycopg connection with ``pg_lsn`` read and written as ``LSN``.

        ``replication=True`` opens a ``replication=database`` connection, which accepts the
        replication protocol's commands (``CREATE_REPLICATION_SLOT ... SNAPSHOT 'export'``).
        Connection failures raise ``ConnectionFailedError`` with the password removed.
        """
        params = self.connection_params()
        if replication:
            params["replication"] = "database"
        try:
            conn = psycopg.connect(
                conninfo.make_dsn(params),
                autocommit=autocommit,
                row_factory=dict_row,
                cursor_factory=psycopg.ClientCursor if replication else psycopg.Cursor,
            )
        except psycopg.OperationalError as exc:
            reason = conninfo.redact(str(exc).strip(), conninfo.secrets_of(params))
            raise ConnectionFailedError(
                f"cannot connect to PostgreSQL {conninfo.describe(params)} "
                f"(Airflow connection {self.get_conn_id()!r}): {reason}. Fix: check host, port, "
                f"login and password of that connection and that the server accepts it "
                f"(pg_hba.conf)"
            ) from None
        register_lsn_adapters(conn)
        with conn:
            yield conn

    @contextmanager
    def _use(
        self, conn: psycopg.Connection[dict[str, Any]] | None
    ) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        if conn is not None:
            yield conn
        else:
            with self.session() as own:
                yield own

    # -- server facts ---------------------------------------------------------------------

    def server_facts(
        self, *, conn: psycopg.Connection[dict[str, Any]] | None = None
    ) -> ServerFacts:
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
        assert head is not None
        values = {row["name"]: _setting_value(row["setting"], row["unit"]) for row in rows}
        keep = values.get("max_slot_wal_keep_size")
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
        )

    def require_logical_decoding(
        self, *, conn: psycopg.Connection[dict[str, Any]] | None = None
    ) -> ServerFacts:
        """Server facts, or ``ServerNotConfiguredError`` naming ``wal_level`` when not logical."""
        facts = self.server_facts(conn=conn)
        if facts.wal_level != "logical":
            raise wal_level_error(facts.wal_level)
        return facts

    def current_wal_lsn(self, *, conn: psycopg.Connection[dict[str, Any]] | None = None) -> LSN:
        """The server's current WAL write position (replay position on a standby)."""
        with self._use(conn) as c:
            row = c.execute(sql.SQL("SELECT {} AS lsn").format(_CURRENT_LSN)).fetchone()
        assert row is not None
        return LSN(row["lsn"])

    # -- slots ----------------------------------------------------------------------------

    def create_logical_slot(
        self,
        name: str,
        *,
        plugin: str = "pgoutput",
        temporary: bool = False,
        two_phase: bool = False,
        conn: psycopg.Connection[dict[str, Any]] | None = None,
    ) -> SlotCreated:
        """Create a logical slot; decoding through it starts at the returned consistent point.

        A temporary slot is dropped when its session ends, so it needs ``conn=`` (a session the
        caller keeps open). Raises ``SlotAlreadyExistsError``, ``ServerNotConfiguredError``
        (``wal_level`` below ``logical``, no free slot) or ``InvalidSlotNameError``.
        """
        validate_slot_name(name)
        if plugin not in OUTPUT_PLUGINS:
            raise ValueError(
                f"unknown output plugin {plugin!r} for slot {name!r}; use one of {OUTPUT_PLUGINS}"
            )
        if temporary and conn is None:
            raise ValueError(
                f"temporary slot {name!r} would be dropped as soon as the hook's own session "
                f"closes; pass conn= (a session you keep open) or create a permanent slot"
            )
        args = [sql.SQL("slot_name => %s"), sql.SQL("plugin => %s"), sql.SQL("temporary => %s")]
        params: list[Any] = [name, plugin, temporary]
        if two_phase:  # the parameter exists from PostgreSQL 14; only name it when asked for
            args.append(sql.SQL("two_phase => %s"))
            params.append(True)
        query = sql.SQL("SELECT slot_name, lsn FROM pg_create_logical_replication_slot({})").format(
            sql.SQL(", ").join(args)
        )
        with self._use(conn) as c, slot_errors(name, setting=lambda s: _show(c, s)):
            row = c.execute(query, params).fetchone()
        assert row is not None
        self.log.info("Created logical slot %s (plugin %s) at %s", name, plugin, row["lsn"])
        return SlotCreated(name=row["slot_name"], lsn=row["lsn"], plugin=plugin)

    def drop_slot(
        self,
        name: str,
        *,
        missing_ok: bool = False,
        conn: psycopg.Connection[dict[str, Any]] | None = None,
    ) -> bool:
        """Drop a slot (it stops retaining WAL). Returns False when absent and ``missing_ok``.

        Raises ``SlotInUseError`` while a consumer is attached.
        """
        validate_slot_name(name)
        try:
            with self._use(conn) as c, slot_errors(name, setting=lambda s: _show(c, s)):
                c.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        except SlotNotFoundError:
            if missing_ok:
                return False
            raise
        self.log.info("Dropped replication slot %s", name)
        return True

    def get_slot(
        self,
        name: str,
        *,
        plugin: str | None = None,
        conn: psycopg.Connection[dict[str, Any]] | None = None,
    ) -> SlotInfo:
        """The slot's current record; ``SlotNotFoundError`` when absent.

        With ``plugin=``, also ``WrongPluginError`` when the slot decodes with another plugin.
        """
        validate_slot_name(name)
        with self._use(conn) as c:
            row = c.execute(_SLOTS_QUERY + sql.SQL(" WHERE s.slot_name = %s"), (name,)).fetchone()
        if row is None:
            raise SlotNotFoundError(name)
        slot = _slot_info(row)
        if plugin is not None and slot.plugin != plugin:
            raise WrongPluginError(name, slot.plugin, plugin)
        return slot

    def list_slots(
        self,
        *,
        logical_only: bool = True,
        conn: psycopg.Connection[dict[str, Any]] | None = None,
    ) -> list[SlotInfo]:
        """All slots on the server (logical ones only by default), ordered by name."""
        where = sql.SQL(" WHERE s.slot_type = 'logical'" if logical_only else "")
        with self._use(conn) as c:
            rows = c.execute(_SLOTS_QUERY + where + sql.SQL(" ORDER BY s.slot_name")).fetchall()
        return [_slot_info(row) for row in rows]

    def advance_slot(
        self,
        name: str,
        upto: LSN | str,
        *,
        conn: psycopg.Connection[dict[str, Any]] | None = None,
    ) -> LSN:
        """Move the slot's confirmed position forward to ``upto``; return where it really ended.

        PostgreSQL stops at its flushed WAL position when ``upto`` is beyond it, so the result
        can be lower than asked. The new position is made durable only at the next checkpoint:
        after a crash the slot may be found behind it again (callers that need exactly-once keep
        their own record of what they committed). Raises ``SlotInUseError`` while a consumer is
        attached, ``SlotAdvanceError`` when ``upto`` is behind the slot.
        """
        validate_slot_name(name)
        target = LSN(upto)
        if int(target) == 0:  # InvalidXLogRecPtr; the server answers with an internal error
            raise SlotAdvanceError(name, f"cannot advance replication slot {name!r} to 0/0")
        with self._use(conn) as c, slot_errors(name, setting=lambda s: _show(c, s)):
            row = c.execute(
                "SELECT end_lsn FROM pg_replication_slot_advance(%s, %s)", (name, target)
            ).fetchone()
        assert row is not None
        end = LSN(row["end_lsn"])
        self.log.info("Advanced slot %s to %s (asked for %s)", name, end, target)
        return end

    def peek_changes(
        self,
        slot: str,
        *,
        upto_lsn: LSN | str | None,
        options: Mapping[str, str],
        binary: bool = True,
        upto_nchanges: int | None = None,
        batch_rows: int = 5000,
    ) -> Iterator[tuple[LSN, int | None, bytes | str]]:
        """Stream ``(lsn, xid, data)`` rows from the slot without consuming it.

        Uses ``pg_logical_slot_peek_binary_changes`` (pgoutput) or ``pg_logical_slot_peek_changes``
        (text plugins) through a server-side cursor, so memory stays at ``batch_rows`` rows however
        much the window holds. Only transactions that commit at or before ``upto_lsn`` come back,
        whole. The slot does not move: advance it with ``advance_slot`` once what was read is
        durably stored. Decoding restarts at the slot's ``restart_lsn`` on every call.
        ``options`` are the output plugin's options (for pgoutput: ``proto_version``,
        ``publication_names``, ``messages``, ``streaming``, ``binary``).
        See https://www.postgresql.org/docs/15/functions-admin.html#FUNCTIONS-REPLICATION
        """
        validate_slot_name(slot)
        function = sql.Identifier(
            "pg_logical_slot_peek_binary_changes" if binary else "pg_logical_slot_peek_changes"
        )
        query = sql.SQL(
            "SELECT lsn, xid::text::bigint AS xid, data FROM {}(%s, %s, %s, VARIADIC %s::text[])"
        ).format(function)
        flat = [item for pair in options.items() for item in pair]
        target = None if upto_lsn is None else LSN(upto_lsn)
        with self.session(autocommit=False) as conn:
            with (
                slot_errors(slot, setting=lambda s: _show(conn, s)),
                conn.cursor(name="pglogrepl_peek", row_factory=tuple_row) as cur,
            ):
                cur.itersize = batch_rows
                cur.execute(query, (slot, target, upto_nchanges, flat))
                yield from cur
            conn.rollback()  # read-only; nothing to keep


def _show(conn: psycopg.Connection[dict[str, Any]], name: str) -> str:
    row = conn.execute("SELECT current_setting(%s) AS value", (name,)).fetchone()
    return str(row["value"]) if row else "unknown"


def _setting_value(setting: str, unit: str | None) -> str | int:
    if unit is None:
        return setting
    number = int(setting)
    if number < 0 or unit not in _UNIT_BYTES:
        return number
    return number * _UNIT_BYTES[unit]


def _lsn_or_none(text: str | None) -> LSN | None:
    return None if text is None else LSN(text)


def _slot_info(row: dict[str, Any]) -> SlotInfo:
    s = row["slot"]  # jsonb: psycopg's default loader gives a dict
    since = s.get("inactive_since")
    return SlotInfo(
        name=s["slot_name"],
        plugin=s.get("plugin"),
        slot_type=s["slot_type"],
        database=s.get("database"),
        temporary=bool(s.get("temporary")),
        active=bool(s.get("active")),
        active_pid=s.get("active_pid"),
        restart_lsn=_lsn_or_none(s.get("restart_lsn")),
        confirmed_flush_lsn=_lsn_or_none(s.get("confirmed_flush_lsn")),
        wal_status=s.get("wal_status"),
        safe_wal_size=s.get("safe_wal_size"),
        two_phase=s.get("two_phase"),
        retained_bytes=row["retained_bytes"],
        current_lsn=row["current_lsn"],
        inactive_since=dt.datetime.fromisoformat(since) if since else None,
    )
