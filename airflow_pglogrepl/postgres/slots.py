"""Logical replication slots as statements on a psycopg connection: create, read, list, advance,
drop, and peek at their changes."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg.types.numeric import Int8BinaryLoader, OidBinaryLoader

from airflow_pglogrepl.exceptions import (
    PublicationNotFoundError,
    SlotAdvanceError,
    SlotNotFoundError,
    WrongPluginError,
)
from airflow_pglogrepl.identifiers import (
    publication_list,
    publication_names_option,
    validate_slot_name,
)
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import SlotCreated, SlotInfo, SlotSpill
from airflow_pglogrepl.postgres import server
from airflow_pglogrepl.postgres.connect import (
    TEXT_OUTPUT,
    AsyncConn,
    Conn,
    connect,
    in_hot_standby,
    long_work_settings,
    server_of,
    set_session,
    show,
)
from airflow_pglogrepl.postgres.errors import slot_errors
from airflow_pglogrepl.postgres.lsn_adapters import PG_LSN_OID
from airflow_pglogrepl.postgres.server import CURRENT_LSN
from airflow_pglogrepl.versions import Features

OUTPUT_PLUGINS = ("pgoutput", "test_decoding", "wal2json")

log = logging.getLogger("airflow_pglogrepl.slots")

# to_jsonb(s) keeps this one query valid across versions: columns added later (inactive_since in
# 17, two_phase in 14) are simply absent on older servers.
SLOTS_QUERY = sql.SQL(
    "SELECT to_jsonb(s) AS slot, {lsn} AS current_lsn,"
    " pg_wal_lsn_diff({lsn}, s.restart_lsn)::bigint AS retained_bytes"
    " FROM pg_replication_slots s"
).format(lsn=CURRENT_LSN)
SLOT_BY_NAME = SLOTS_QUERY + sql.SQL(" WHERE s.slot_name = %s")


def create_logical_slot(
    conn: Conn, name: str, *, plugin: str = "pgoutput", temporary: bool = False,
    two_phase: bool = False, failover: bool | None = False,
) -> SlotCreated:  # fmt: skip
    """Create a logical slot; decoding through it starts at the returned consistent point.

    A temporary slot is dropped when ``conn`` closes. ``failover``: synchronized to standbys
    (``models.failover.wants_failover``: None is wherever the server can). Raises
    ``SlotAlreadyExistsError``, ``ServerNotConfiguredError`` (``wal_level`` below ``logical``,
    no free slot), ``FailoverSlotUnsupportedError`` or ``InvalidSlotNameError``.
    """
    from airflow_pglogrepl.models.failover import wants_failover

    validate_slot_name(name)
    if plugin not in OUTPUT_PLUGINS:
        raise ValueError(
            f"unknown output plugin {plugin!r} for slot {name!r}; use one of {OUTPUT_PLUGINS}"
        )
    args = [sql.SQL("slot_name => %s"), sql.SQL("plugin => %s"), sql.SQL("temporary => %s")]
    params: list[Any] = [name, plugin, temporary]
    if two_phase:  # the parameter exists from PostgreSQL 14; only name it when asked for
        args.append(sql.SQL("twophase => %s"))
        params.append(True)
    as_failover = wants_failover(name, server_of(conn), conn.info.server_version,
                                 in_hot_standby=in_hot_standby(conn), requested=failover,
                                 temporary=temporary)  # fmt: skip
    if as_failover:
        args.append(sql.SQL("failover => %s"))  # (17+; only named when asked for)
        params.append(True)
    query = sql.SQL("SELECT slot_name, lsn FROM pg_create_logical_replication_slot({})").format(
        sql.SQL(", ").join(args)
    )
    with slot_errors(name, setting=lambda s: show(conn, s), server=server_of(conn)):
        row = conn.execute(query, params).fetchone()
    assert row is not None
    log.info("Created logical %sslot %s (plugin %s) at %s", "failover " if as_failover else "",
             name, plugin, row["lsn"])  # fmt: skip
    return SlotCreated(name=row["slot_name"], lsn=row["lsn"], plugin=plugin, failover=as_failover)


def drop_slot(conn: Conn, name: str, *, missing_ok: bool = False) -> bool:
    """Drop a slot (it stops retaining WAL). Returns False when absent and ``missing_ok``.

    Raises ``SlotInUseError`` while a consumer is attached.
    """
    validate_slot_name(name)
    try:
        with slot_errors(name, setting=lambda s: show(conn, s), server=server_of(conn)):
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except SlotNotFoundError:
        if missing_ok:
            return False
        raise
    log.info("Dropped replication slot %s", name)
    return True


def get_slot(conn: Conn, name: str, *, plugin: str | None = None) -> SlotInfo:
    """The slot's current record; ``SlotNotFoundError`` when absent.

    With ``plugin=``, also ``WrongPluginError`` when the slot decodes with another plugin.
    """
    validate_slot_name(name)
    row = conn.execute(SLOT_BY_NAME, (name,)).fetchone()
    if row is None:
        raise SlotNotFoundError(name)
    slot = slot_info(row)
    if plugin is not None and slot.plugin != plugin:
        raise WrongPluginError(name, slot.plugin, plugin)
    return slot


def slot_holder(conn: Conn, name: str) -> int | None:
    """The PID of the process holding the slot now (a walsender, a peek's backend); None
    when it is free or absent. Read from the server's shared memory on every call: no
    snapshot of a transaction keeps an older answer."""
    row = conn.execute(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (name,)
    ).fetchone()
    return None if row is None or row["active_pid"] is None else int(row["active_pid"])


def slot_holder_wait(conn: Conn, name: str) -> tuple[int | None, str | None]:
    """``slot_holder``, and what that process waits on (``pg_stat_activity``'s
    ``wait_event_type/wait_event``; None: on nothing, or not shown to this role)."""
    row = conn.execute(
        "SELECT s.active_pid, a.wait_event_type, a.wait_event FROM pg_replication_slots s"
        " LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = %s",
        (name,),
    ).fetchone()
    if row is None or row["active_pid"] is None:
        return None, None
    wait = None
    if row["wait_event_type"] or row["wait_event"]:
        wait = f"{row['wait_event_type']}/{row['wait_event']}"
    return int(row["active_pid"]), wait


def terminate_holder(conn: Conn, name: str, pid: int) -> bool:
    """``pg_terminate_backend(pid)`` while ``pid`` still holds the slot, in one statement: a
    PID the server has since given to another process is never signalled. True: signalled
    (it ends at its next interrupt check). A role may end its own processes; another's raise
    ``psycopg.errors.InsufficientPrivilege``."""
    row = conn.execute(
        "SELECT pg_terminate_backend(active_pid) AS ok FROM pg_replication_slots"
        " WHERE slot_name = %s AND active_pid = %s",
        (name, pid),
    ).fetchone()
    return bool(row and row["ok"])


async def find_slot(conn: AsyncConn, name: str) -> SlotInfo | None:
    """The slot's record on an async connection (the triggers'); None when absent."""
    validate_slot_name(name)
    row = await (await conn.execute(SLOT_BY_NAME, (name,))).fetchone()
    return None if row is None else slot_info(row)


async def has_published_change(conn: AsyncConn, slot: str, publications: Sequence[str],
                               upto: LSN) -> bool:  # fmt: skip
    """Whether the pgoutput slot holds a change of ``publications`` committed before ``upto``:
    a peek for one change (pgoutput sends nothing for a transaction without one), which never
    moves the slot. It decodes from the slot's ``restart_lsn`` up to the first such change."""
    validate_slot_name(slot)
    options = ["proto_version", "1", "publication_names", publication_names_option(publications),
               "messages", "false"]  # fmt: skip
    query = sql.SQL(
        "SELECT 1 FROM pg_logical_slot_peek_binary_changes(%s, %s, 1, VARIADIC %s::text[]) LIMIT 1"
    )
    row = await (await conn.execute(query, (slot, upto, options))).fetchone()
    return row is not None


def list_slots(conn: Conn, *, logical_only: bool = True) -> list[SlotInfo]:
    """All slots on the server (logical ones only by default), ordered by name."""
    where = sql.SQL(" WHERE s.slot_type = 'logical'" if logical_only else "")
    rows = conn.execute(SLOTS_QUERY + where + sql.SQL(" ORDER BY s.slot_name")).fetchall()
    return [slot_info(row) for row in rows]


def slot_spill(conn: Conn, name: str) -> SlotSpill | None:
    """The slot's decoding statistics (``pg_stat_replication_slots``: transactions spilled to
    disk or streamed, and their bytes), or None when the server keeps none for it (no such
    slot)."""
    row = conn.execute(
        "SELECT slot_name AS slot, spill_txns, spill_bytes, stream_txns, stream_bytes,"
        " total_txns, total_bytes FROM pg_stat_replication_slots WHERE slot_name = %s",
        (name,),
    ).fetchone()
    return None if row is None else SlotSpill(**row)


def advance_slot(conn: Conn, name: str, upto: LSN | str) -> LSN:
    """Move the slot's confirmed position forward to ``upto``; return where it really ended.

    PostgreSQL stops at its flushed WAL position when ``upto`` is beyond it, so the result can be
    lower than asked. The new position is made durable only at the next checkpoint: after a
    crash the slot may be found behind it again (callers that need exactly-once keep their own
    record of what they committed). Raises ``SlotInUseError`` while a consumer is attached,
    ``SlotAdvanceError`` when ``upto`` is behind the slot.
    """
    validate_slot_name(name)
    target = LSN(upto)
    if int(target) == 0:  # InvalidXLogRecPtr; the server answers with an internal error
        raise SlotAdvanceError(name, f"cannot advance replication slot {name!r} to 0/0")
    with slot_errors(name, setting=lambda s: show(conn, s), server=server_of(conn)):
        row = conn.execute(
            "SELECT end_lsn FROM pg_replication_slot_advance(%s, %s)", (name, target)
        ).fetchone()
    assert row is not None
    end = LSN(row["end_lsn"])
    log.info("Advanced slot %s to %s (asked for %s)", name, end, target)
    return end


def peek_changes(
    params: dict[str, str],
    slot: str,
    *,
    label: str,
    upto_lsn: LSN | str | None,
    options: Mapping[str, str],
    binary: bool = True,
    upto_nchanges: int | None = None,
    batch_rows: int = 5000,
) -> Iterator[tuple[LSN, int | None, bytes | str]]:
    """Stream ``(lsn, xid, data)`` rows from the slot without consuming it, in a session of its
    own opened with ``params`` (``label`` names them in errors).

    Uses ``pg_logical_slot_peek_binary_changes`` (pgoutput; ``data`` is ``bytes``) or
    ``pg_logical_slot_peek_changes`` (text plugins; ``data`` is ``str``). Memory stays at about
    ``batch_rows`` rows however much the window holds: rows arrive in chunks of that many
    (libpq's chunked-rows mode, or a server-side cursor with an older libpq), and the server
    waits while the caller is behind. Only transactions that commit at or before ``upto_lsn``
    come back, whole. The slot does not move: advance it with ``advance_slot`` once what was
    read is durably stored. Decoding restarts at the slot's ``restart_lsn`` on every call.
    ``options`` are the output plugin's options (for pgoutput: ``proto_version``,
    ``publication_names``, ``messages``, ``streaming``, ``binary``).
    See https://www.postgresql.org/docs/15/functions-admin.html#FUNCTIONS-REPLICATION
    """
    validate_slot_name(slot)
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
    function = sql.Identifier(
        "pg_logical_slot_peek_binary_changes" if binary else "pg_logical_slot_peek_changes"
    )
    query = sql.SQL("SELECT lsn, xid, data FROM {}(%s, %s, %s, VARIADIC %s::text[])").format(
        function
    )
    flat = [item for pair in options.items() for item in pair]
    target = None if upto_lsn is None else LSN(upto_lsn)
    arguments = (slot, target, upto_nchanges, flat)
    chunked = _chunked_rows()
    # Chunked rows need no transaction; a server-side cursor lives in one (rolled back).
    with connect(params, label=label, autocommit=chunked) as conn:
        set_session(conn, TEXT_OUTPUT)  # values print as the decoder reads them
        # a big window is decoded into a tuplestore first: no configured timeout may end it
        set_session(conn, long_work_settings(conn.info.server_version))
        if Features.of(conn.info.server_version).missing_publication_skipped:
            # 18 decodes past a missing publication with only a warning: look first
            missing = server.missing_publications(conn, publication_list(options))
            if missing:
                raise PublicationNotFoundError(
                    missing, slot, server_version=conn.info.server_version
                )
        with slot_errors(slot, setting=lambda s: show(conn, s), server=server_of(conn)):
            rows = _fetch(conn, query, arguments, batch_rows, chunked=chunked)
            try:
                from_server = LSN.from_server  # no argument checks: the server's pg_lsn
                for value, xid, data in rows:
                    yield from_server(value), xid, data
            finally:
                rows.close()  # a caller that stopped early: cancel the query, drain the rest
        if not chunked:
            conn.rollback()  # read-only; nothing to keep


# pg_lsn's binary form is int8's (8 bytes, big endian, unsigned) and xid's is oid's (4 bytes,
# unsigned): psycopg's compiled loaders read them without a cast on the server or a Python call
# per value. The LSN objects are then built by LSN.from_server, without LSN's argument checks.
_XID_OID = 28


def _chunked_rows() -> bool:
    """Whether ``Cursor.stream(size=...)`` is available (psycopg 3.2+ over libpq 17+)."""
    capabilities = getattr(psycopg, "capabilities", None)
    return bool(capabilities is not None and capabilities.has_stream_chunked())


def _fetch(
    conn: Conn, query: sql.Composed, params: Sequence[Any], batch_rows: int, *, chunked: bool
) -> Generator[tuple[Any, ...], None, None]:
    """The query's rows as tuples, ``batch_rows`` at a time from the server, binary format."""
    if chunked:
        with conn.cursor(row_factory=tuple_row, binary=True) as cur:
            _integer_loaders(cur)
            yield from cur.stream(query, params, size=batch_rows)
    else:
        with conn.cursor(name="pglogrepl_peek", row_factory=tuple_row, binary=True) as named:
            _integer_loaders(named)
            named.itersize = batch_rows
            named.execute(query, params)
            yield from named


def _integer_loaders(cur: psycopg.Cursor[Any] | psycopg.ServerCursor[Any]) -> None:
    """Read pg_lsn and xid as plain integers (compiled loaders, no Python call per value)."""
    cur.adapters.register_loader(PG_LSN_OID, Int8BinaryLoader)
    cur.adapters.register_loader(_XID_OID, OidBinaryLoader)


def _lsn_or_none(text: str | None) -> LSN | None:
    return None if text is None else LSN(text)


def slot_info(row: dict[str, Any]) -> SlotInfo:
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
        invalidation_reason=s.get("invalidation_reason"),
        failover=s.get("failover"),
        synced=s.get("synced"),
    )
