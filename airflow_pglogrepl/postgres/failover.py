"""Failover slots as statements: making an existing slot one, and reading what the primary and
a standby say about it (``models.failover`` judges it).

A standby's ``primary_conninfo`` holds the password it connects with: it is parsed where it is
read, only whether it names a ``dbname`` is kept, and it is never logged.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from airflow_pglogrepl.exceptions import SlotNotFoundError
from airflow_pglogrepl.identifiers import validate_slot_name
from airflow_pglogrepl.models.failover import FailoverPrimary, FailoverStandby
from airflow_pglogrepl.postgres.connect import Conn, connect, server_of, show
from airflow_pglogrepl.postgres.errors import slot_errors
from airflow_pglogrepl.postgres.slots import get_slot
from airflow_pglogrepl.versions import Features

__all__ = ["make_failover_slot", "primary_failover", "standby_failover"]

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
    " current_setting('primary_slot_name', true) AS primary_slot"
)


def make_failover_slot(params: dict[str, str], name: str, *, label: str) -> None:
    """``ALTER_REPLICATION_SLOT name ( FAILOVER true )`` (17+, a replication connection): an
    existing slot is synchronized to standbys from now on. Fails while a consumer holds it
    (``SlotInUseError``)."""
    validate_slot_name(name)
    statement = sql.SQL("ALTER_REPLICATION_SLOT {} ( FAILOVER true )").format(sql.Identifier(name))
    with (
        connect(params, label=label, replication=True) as conn,
        slot_errors(name, setting=lambda s: show(conn, s), server=server_of(conn)),
    ):
        conn.execute(statement)
    log.info("Slot %s is a failover slot now", name)


def primary_failover(conn: Conn, slot: str) -> FailoverPrimary:
    """The primary's side of ``slot``'s failover (``SlotNotFoundError`` when it has none)."""
    info = get_slot(conn, slot)
    version = conn.info.server_version
    names: tuple[str, ...] = ()
    active: dict[str, bool] = {}
    if Features.of(version).failover_slots:
        names = tuple(n.strip() for n in show(conn, "synchronized_standby_slots").split(",")
                      if n.strip())  # fmt: skip
        if names:
            rows = conn.execute(_STANDBY_SLOTS, (list(names),)).fetchall()
            active = {r["slot_name"]: bool(r["active"]) for r in rows}
    return FailoverPrimary(
        server=server_of(conn), version_num=version, slot=info,
        synchronized_standby_slots=names, standby_slots_active=active,
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
        copy=copy,
    )
