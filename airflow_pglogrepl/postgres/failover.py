"""Failover slots as statements: making an existing slot one, and reading what the primary and
a standby say about it (``models.failover`` judges it).

A standby's ``primary_conninfo`` holds the password it connects with: it is parsed where it is
read, only whether it names a ``dbname`` is kept, and it is never logged.
"""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg import sql

from airflow_pglogrepl.exceptions import SlotInUseError, SlotNotFoundError
from airflow_pglogrepl.identifiers import validate_slot_name
from airflow_pglogrepl.models.failover import FailoverPrimary, FailoverStandby
from airflow_pglogrepl.postgres.connect import Conn, connect, server_of, show
from airflow_pglogrepl.postgres.errors import slot_errors
from airflow_pglogrepl.postgres.slots import get_slot, slot_holder
from airflow_pglogrepl.versions import Features

__all__ = [
    "absent_standby_slots",
    "make_failover_slot",
    "primary_failover",
    "standby_failover",
    "standby_slot_names",
]

log = logging.getLogger("airflow_pglogrepl.slots")

_STANDBY_SLOTS = sql.SQL(
    "SELECT slot_name, active FROM pg_replication_slots"
    " WHERE slot_type = 'physical' AND slot_name = ANY(%s)"
)
# pg_settings leaves out what the role may not read (primary_conninfo without
# pg_read_all_settings): no row is "unknown", not an error
_CONNINFO = sql.SQL("SELECT setting FROM pg_settings WHERE name = 'primary_conninfo'")
_STANDBY = sql.SQL(
    "SELECT pg_is_in_recovery() AS in_recovery,"
    " current_setting('sync_replication_slots', true) AS sync_slots,"
    " current_setting('hot_standby_feedback') AS feedback,"
    " current_setting('primary_slot_name', true) AS primary_slot,"
    " current_setting('wal_level') AS wal_level,"
    " (SELECT system_identifier::text FROM pg_control_system()) AS system_identifier"
)
_SYSTEM = sql.SQL(
    "SELECT pg_is_in_recovery() AS in_recovery,"
    " (SELECT system_identifier::text FROM pg_control_system()) AS system_identifier"
)
# The server waits for a consumer to let go of the slot instead of refusing: a bound
ALTER_WAIT_S = 10.0


def standby_slot_names(setting: str) -> tuple[str, ...]:
    """``synchronized_standby_slots`` as the server reads it: a list of identifiers, an
    unquoted one folded to lower case, a double-quoted one as written."""
    names: list[str] = []
    for item in _split_identifiers(setting):
        if len(item) >= 2 and item[0] == item[-1] == '"':
            names.append(item[1:-1].replace('""', '"'))
        elif item:
            names.append(item.lower())
    return tuple(names)


def _split_identifiers(setting: str) -> list[str]:
    items: list[str] = []
    current: list[str] = []
    quoted = False
    for char in setting:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    items.append("".join(current).strip())
    return items


def absent_standby_slots(conn: Conn) -> list[str]:
    """The physical slots ``synchronized_standby_slots`` names (17+) that do not exist or that
    no standby streams through now: a failover slot's readers wait for them."""
    if not Features.of(conn.info.server_version).failover_slots:
        return []
    names = standby_slot_names(show(conn, "synchronized_standby_slots"))
    if not names:
        return []
    rows = conn.execute(_STANDBY_SLOTS, (list(names),)).fetchall()
    active = {r["slot_name"] for r in rows if r["active"]}
    return [name for name in names if name not in active]


def make_failover_slot(params: dict[str, str], name: str, *, label: str,
                       wait_s: float = ALTER_WAIT_S) -> None:  # fmt: skip
    """``ALTER_REPLICATION_SLOT name ( FAILOVER true )`` (17+, a replication connection): an
    existing slot is synchronized to standbys from now on. A slot a consumer holds is refused
    (``SlotInUseError``): the server would wait for the consumer to let go, and so it does for
    ``wait_s`` at most when one took the slot in between."""
    validate_slot_name(name)
    statement = sql.SQL("ALTER_REPLICATION_SLOT {} ( FAILOVER true )").format(sql.Identifier(name))
    with connect(params, label=label, replication=True) as conn:
        holder = slot_holder(conn, name)
        if holder is not None:
            raise SlotInUseError(name, holder)
        timer = threading.Timer(wait_s, conn.cancel)
        timer.daemon = True
        timer.start()
        try:
            with slot_errors(name, setting=lambda s: show(conn, s), server=server_of(conn)):
                conn.execute(statement)
        except psycopg.errors.QueryCanceled:
            raise SlotInUseError(name, slot_holder(conn, name)) from None
        finally:
            timer.cancel()
    log.info("Slot %s is a failover slot now", name)


def primary_failover(conn: Conn, slot: str) -> FailoverPrimary:
    """The primary's side of ``slot``'s failover (``SlotNotFoundError`` when it has none)."""
    info = get_slot(conn, slot)
    version = conn.info.server_version
    names: tuple[str, ...] = ()
    active: dict[str, bool] = {}
    system = conn.execute(_SYSTEM).fetchone()
    assert system is not None
    if Features.of(version).failover_slots:
        names = standby_slot_names(show(conn, "synchronized_standby_slots"))
        if names:
            rows = conn.execute(_STANDBY_SLOTS, (list(names),)).fetchall()
            active = {r["slot_name"]: bool(r["active"]) for r in rows}
    return FailoverPrimary(
        server=server_of(conn), version_num=version, slot=info,
        synchronized_standby_slots=names, standby_slots_active=active,
        in_recovery=bool(system["in_recovery"]), system_identifier=system["system_identifier"],
    )  # fmt: skip


def standby_failover(conn: Conn, slot: str) -> FailoverStandby:
    """A standby's side: its slot sync settings and its copy of ``slot`` (None: it has none)."""
    row = conn.execute(_STANDBY).fetchone()
    assert row is not None
    conninfo = conn.execute(_CONNINFO).fetchone()
    has_dbname: bool | None = None
    if conninfo is not None:
        try:
            has_dbname = bool(psycopg.conninfo.conninfo_to_dict(conninfo["setting"] or "")
                              .get("dbname"))  # fmt: skip
        except psycopg.ProgrammingError:
            has_dbname = False  # (the server would not take it either)
    try:
        copy = get_slot(conn, slot)
    except SlotNotFoundError:
        copy = None
    return FailoverStandby(
        server=server_of(conn),
        in_recovery=bool(row["in_recovery"]),
        sync_replication_slots=row["sync_slots"] == "on",
        hot_standby_feedback=row["feedback"] == "on",
        primary_slot_name=row["primary_slot"] or None,
        conninfo_has_dbname=has_dbname,
        wal_level=row["wal_level"],
        system_identifier=row["system_identifier"],
        copy=copy,
    )
