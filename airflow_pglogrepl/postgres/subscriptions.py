"""The subscription statements, as functions of a psycopg connection: a subscription's definition
as the catalog has it (its publisher's connection only where this role may read it), its tables'
sync states and workers, the table-sync slots it may leave on the publisher, and the DDL that
creates, changes, detaches and drops it.

``subconninfo`` holds the publisher's password: it is read only to compare, never shown, and
the statements that carry it are sent by the mixin only after ``quiet_secret_statements``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.models.records import RelState, SubscriptionInfo, SubscriptionStatus
from airflow_pglogrepl.postgres.connect import AsyncConn, Conn
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features

# Options CREATE SUBSCRIPTION takes (15 to 18); those ALTER SUBSCRIPTION ... SET accepts.
CREATE_OPTIONS = frozenset(
    {"copy_data", "create_slot", "enabled", "connect", "slot_name", "synchronous_commit",
     "streaming", "binary", "two_phase", "disable_on_error", "origin", "password_required",
     "run_as_owner", "failover"}
)  # fmt: skip
SETTABLE_OPTIONS = frozenset(
    {"slot_name", "synchronous_commit", "streaming", "binary", "disable_on_error", "origin",
     "password_required", "run_as_owner"}
)  # fmt: skip
# The first major version that takes an option (or a value of one); older ones refuse it.
OPTION_SINCE: dict[str, int] = {
    "origin": 16,
    "password_required": 16,
    "run_as_owner": 16,
    "streaming=parallel": 16,
    "failover": 17,
}
TARGET_KEYS = ("host", "port", "dbname", "user")

_THIS_DB = sql.SQL("s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
_INFO = sql.SQL(
    "SELECT s.subname, s.subenabled, s.subslotname, s.subpublications, s.subbinary,"
    " s.substream::text AS substream, s.subsynccommit, s.subdisableonerr, {newer}"
    " FROM pg_subscription s WHERE s.subname = %s AND {this_db}"
)
# Options that ALTER ... SET can change, as the catalog has them (16+ and 17+ columns).
_OPTIONS_16 = sql.SQL("s.suborigin, s.subpasswordrequired, s.subrunasowner")
_READ_BACK = (
    ("disable_on_error", "subdisableonerr"),
    ("origin", "suborigin"),
    ("password_required", "subpasswordrequired"),
    ("run_as_owner", "subrunasowner"),
)
_OPTIONS_15 = sql.SQL("NULL AS suborigin, NULL AS subpasswordrequired, NULL AS subrunasowner")
# subconninfo holds the publisher's password: only superusers may read it (a column privilege,
# checked when the statement is parsed, so a separate statement after has_column_privilege).
_CONNINFO_READABLE = sql.SQL(
    "SELECT has_column_privilege('pg_catalog.pg_subscription', 'subconninfo', 'SELECT') AS ok"
)
_CONNINFO = sql.SQL(
    "SELECT s.subconninfo FROM pg_subscription s WHERE s.subname = %s AND {this_db}"
).format(this_db=_THIS_DB)
_RELS = sql.SQL(
    "SELECT n.nspname AS schema, c.relname AS name, sr.srsubstate::text AS state,"
    " sr.srsublsn AS lsn FROM pg_subscription_rel sr"
    " JOIN pg_subscription s ON s.oid = sr.srsubid JOIN pg_class c ON c.oid = sr.srrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE s.subname = %s AND {this_db} ORDER BY 1, 2"
).format(this_db=_THIS_DB)
_STATUS = sql.SQL(
    "SELECT s.subenabled AS enabled,"
    " (SELECT count(*) FROM pg_stat_subscription w"
    "  WHERE w.subid = s.oid AND w.pid IS NOT NULL)::int AS workers,"
    " (SELECT count(*) FROM pg_stat_subscription w"
    "  WHERE w.subid = s.oid AND w.pid IS NOT NULL AND w.relid IS NULL)::int AS apply_workers,"
    " (SELECT max(w.received_lsn) FROM pg_stat_subscription w"
    "  WHERE w.subid = s.oid AND w.relid IS NULL) AS received_lsn,"
    " (SELECT max(w.latest_end_lsn) FROM pg_stat_subscription w"
    "  WHERE w.subid = s.oid AND w.relid IS NULL) AS latest_end_lsn,"
    " {errors}"
    " FROM pg_subscription s WHERE s.subname = %s AND {this_db}"
)
_ERRORS_15 = sql.SQL(
    "(SELECT st.apply_error_count FROM pg_stat_subscription_stats st"
    "  WHERE st.subid = s.oid)::int AS apply_error_count,"
    " (SELECT st.sync_error_count FROM pg_stat_subscription_stats st"
    "  WHERE st.subid = s.oid)::int AS sync_error_count"
)
_ERRORS_OLD = sql.SQL("NULL::int AS apply_error_count, NULL::int AS sync_error_count")


def read_subscription(conn: Conn, name: str) -> SubscriptionInfo | None:
    """The subscription's definition (without the password), or None; ``target`` (host,
    port, database, user) only when this role may read ``subconninfo``."""
    newer = (
        _OPTIONS_16 if Features.of(conn.info.server_version).subscription_origin else _OPTIONS_15
    )
    row = conn.execute(_INFO.format(newer=newer, this_db=_THIS_DB), (name,)).fetchone()
    if row is None:
        return None
    stored = stored_conninfo(conn, name)
    target = (
        None
        if stored is None
        else {key: str(stored[key]) for key in TARGET_KEYS if stored.get(key) is not None}
    )
    return SubscriptionInfo(
        name=row["subname"],
        enabled=row["subenabled"],
        slot_name=row["subslotname"],
        publications=tuple(row["subpublications"]),
        binary=row["subbinary"],
        streaming={"f": "off", "t": "on", "p": "parallel"}.get(row["substream"], "off"),
        synchronous_commit=row["subsynccommit"],
        target=target,
        options={key: row[column] for key, column in _READ_BACK if row[column] is not None},
    )


def stored_conninfo(conn: Conn, name: str) -> dict[str, Any] | None:
    """The subscription's stored connection parameters, or None when this role may not read
    them (or the subscription is gone)."""
    readable = conn.execute(_CONNINFO_READABLE).fetchone()
    if readable is None or not readable["ok"]:
        return None
    row = conn.execute(_CONNINFO, (name,)).fetchone()
    return None if row is None else dict(conninfo_to_dict(row["subconninfo"]))


def role_may_create(conn: Conn) -> tuple[str, bool]:
    """The connecting role, and whether it is a superuser."""
    row = conn.execute(
        "SELECT current_user AS role, current_setting('is_superuser') = 'on' AS superuser"
    ).fetchone()
    assert row is not None
    return str(row["role"]), bool(row["superuser"])


def subscription_status(conn: Conn, name: str) -> SubscriptionStatus:
    """Sync states of every table, worker presence, received LSNs and error counters."""
    errors = errors_columns(conn.info.server_version)
    head = conn.execute(_STATUS.format(errors=errors, this_db=_THIS_DB), (name,)).fetchone()
    rels = conn.execute(_RELS, (name,)).fetchall() if head else []
    return subscription_status_of(name, head, rels)


async def asubscription_status(conn: AsyncConn, name: str) -> SubscriptionStatus:
    """``subscription_status`` on an async connection (the triggers')."""
    errors = errors_columns(conn.info.server_version)
    cur = await conn.execute(_STATUS.format(errors=errors, this_db=_THIS_DB), (name,))
    head = await cur.fetchone()
    rels = await (await conn.execute(_RELS, (name,))).fetchall() if head else []
    return subscription_status_of(name, head, rels)


def subscription_status_of(
    name: str, head: dict[str, Any] | None, rels: Sequence[dict[str, Any]]
) -> SubscriptionStatus:
    if head is None:
        return SubscriptionStatus(name=name, exists=False)
    return SubscriptionStatus(
        name=name,
        exists=True,
        enabled=head["enabled"],
        relations=tuple(
            RelState(TableRef(r["schema"], r["name"]), r["state"], r["lsn"]) for r in rels
        ),
        workers=head["workers"],
        apply_worker=head["apply_workers"] > 0,
        received_lsn=head["received_lsn"],
        latest_end_lsn=head["latest_end_lsn"],
        apply_error_count=head["apply_error_count"],
        sync_error_count=head["sync_error_count"],
    )


def errors_columns(server_version: int) -> sql.SQL:
    """The error counters' columns: from ``pg_stat_subscription_stats`` where it exists."""
    return _ERRORS_15 if Features.of(server_version).subscription_skip else _ERRORS_OLD


def sync_slot_names(conn: Conn, name: str) -> tuple[str, ...]:
    """The table-sync slots the subscription may have on the publisher: one per table not yet
    ready, named ``pg_<subscription oid>_sync_<table oid>_<subscriber system identifier>`` as
    PostgreSQL names them (``ReplicationSlotNameForTablesync``)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT format('pg_%%s_sync_%%s_%%s', s.oid, sr.srrelid,"
            " (SELECT system_identifier FROM pg_control_system())) AS slot"
            " FROM pg_subscription s JOIN pg_subscription_rel sr ON sr.srsubid = s.oid"
            " WHERE s.subname = %s AND {} AND sr.srsubstate <> 'r' ORDER BY 1"
        ).format(_THIS_DB),
        (name,),
    ).fetchall()
    return tuple(row["slot"] for row in rows)


def _option_value(value: Any) -> sql.Composable:
    if value is None:
        return sql.SQL("NONE")  # slot_name = NONE detaches the slot
    return sql.Literal(value)


def option_list(options: Mapping[str, Any]) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(key), _option_value(value))
        for key, value in options.items()
    )


def create_statement(
    name: str, dsn: str, publications: Sequence[str], options: Mapping[str, Any]
) -> sql.Composed:
    statement = sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {}").format(
        sql.Identifier(name),
        sql.Literal(dsn),
        sql.SQL(", ").join(sql.Identifier(p) for p in publications),
    )
    if options:
        statement = statement + sql.SQL(" WITH ({})").format(option_list(options))
    return statement


def connection_statement(name: str, publisher_params: Mapping[str, str]) -> sql.Composed:
    return sql.SQL("ALTER SUBSCRIPTION {} CONNECTION {}").format(
        sql.Identifier(name), sql.Literal(conninfo.make_dsn(publisher_params))
    )


def set_publications_statement(
    name: str, publications: Sequence[str], *, refresh: bool, copy_data: bool
) -> sql.Composed:
    """``ALTER SUBSCRIPTION ... SET PUBLICATION``; with ``refresh`` the new tables are copied
    (``copy_data``) and dropped ones let go."""
    return sql.SQL("ALTER SUBSCRIPTION {} SET PUBLICATION {} WITH (refresh = {}{})").format(
        sql.Identifier(name),
        sql.SQL(", ").join(sql.Identifier(p) for p in publications),
        sql.Literal(refresh),
        sql.SQL(", copy_data = {}").format(sql.Literal(copy_data)) if refresh else sql.SQL(""),
    )


def set_options_statement(name: str, options: Mapping[str, Any]) -> sql.Composed:
    return sql.SQL("ALTER SUBSCRIPTION {} SET ({})").format(
        sql.Identifier(name), option_list(options)
    )


def alter_statement(name: str, action: sql.Composable) -> sql.Composed:
    """``ALTER SUBSCRIPTION name action`` (``ENABLE``, ``DISABLE``, ``REFRESH ...``)."""
    return sql.SQL("ALTER SUBSCRIPTION {} {}").format(sql.Identifier(name), action)


def refresh_action(copy_data: bool) -> sql.Composed:
    return sql.SQL("REFRESH PUBLICATION WITH (copy_data = {})").format(sql.Literal(copy_data))


def drop_statement(name: str) -> sql.Composed:
    return sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(name))


def detach_slot_statement(name: str) -> sql.Composed:
    """``SET (slot_name = NONE)``: the subscription forgets its slot, so dropping it does not
    need the publisher (whose slot is then left behind)."""
    return sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(sql.Identifier(name))
