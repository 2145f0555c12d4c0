"""The server, as statements on a psycopg connection: where its WAL stands, its version and
replication settings, its publications and identity, and what the connecting role may do."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import ServerFacts
from airflow_pglogrepl.postgres.connect import Conn

# Where the server's WAL is now; on a standby (PostgreSQL 16+ can decode there) the replay point.
CURRENT_LSN = sql.SQL(
    "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"
)


def flush_lsn(conn: Conn) -> LSN:
    """WAL flushed to disk: the furthest logical decoding can read.

    A drain window must end at or before it; a window ending beyond would let the slot confirm
    transactions that were never decoded.
    """
    row = conn.execute(
        "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
        " ELSE pg_current_wal_flush_lsn() END AS lsn"
    ).fetchone()
    assert row is not None
    return LSN(row["lsn"])


def current_wal_lsn(conn: Conn) -> LSN:
    """The server's current WAL write position (replay position on a standby)."""
    row = conn.execute(sql.SQL("SELECT {} AS lsn").format(CURRENT_LSN)).fetchone()
    assert row is not None
    return LSN(row["lsn"])


# ``::name`` cuts a name to 63 bytes, never inside a character, as the server cuts the
# identifiers of CREATE PUBLICATION, CREATE SUBSCRIPTION and pgoutput's publication_names
MISSING_PUBLICATIONS = (
    "SELECT n AS name FROM unnest(%s::text[]) WITH ORDINALITY AS u(n, i)"
    " WHERE NOT EXISTS (SELECT 1 FROM pg_publication p WHERE p.pubname = u.n::name) ORDER BY i"
)


def missing_publications(conn: Conn, names: Sequence[str]) -> list[str]:
    """The ``names`` (as given) no publication of the connected database has, each compared as
    the server compares it: cut to 63 bytes."""
    rows = conn.execute(MISSING_PUBLICATIONS, (list(names),)).fetchall()
    return [row["name"] for row in rows]


PUBLICATION_NAMES = sql.SQL("SELECT pubname AS name FROM pg_publication ORDER BY pubname")


def publication_names(conn: Conn) -> list[str]:
    """Every publication of the connected database, by name."""
    return [row["name"] for row in conn.execute(PUBLICATION_NAMES).fetchall()]


ROLE_ATTRIBUTES = sql.SQL(
    "SELECT current_user AS role, r.rolsuper AS superuser, r.rolreplication AS replication"
    " FROM pg_roles r WHERE r.rolname = current_user"
)


def role_attributes(conn: Conn) -> dict[str, object]:
    """The connected role's name and whether it is a superuser or has REPLICATION."""
    row = conn.execute(ROLE_ATTRIBUTES).fetchone()
    assert row is not None
    return dict(row)


UNREADABLE_PUBLISHED_TABLES = sql.SQL(
    "SELECT DISTINCT t.schemaname AS schema, t.tablename AS name FROM pg_publication_tables t"
    " WHERE t.pubname = ANY(%s::text[]::name[])"
    " AND NOT has_table_privilege(format('%%I.%%I', t.schemaname, t.tablename), 'SELECT')"
    " ORDER BY 1, 2"
)


def unreadable_published_tables(conn: Conn, publications: Sequence[str]) -> list[tuple[str, str]]:
    """The tables the publications publish that the connected role may not SELECT."""
    rows = conn.execute(UNREADABLE_PUBLISHED_TABLES, (list(publications),)).fetchall()
    return [(row["schema"], row["name"]) for row in rows]


def source_identity(conn: Conn) -> dict[str, object]:
    """Which server, history and database the changes come from: ``system_identifier`` (one
    per cluster, shared with its physical standbys), ``timeline`` (a promotion starts a new
    one: LSNs past the fork are another history), ``database`` and ``database_oid`` (the same
    database after a rename), and ``server_version_num`` (what tells a ``pg_upgrade`` from
    another server). The lake records it with every commit, so a lake is never reconciled
    against another server's LSNs."""
    row = conn.execute(
        "SELECT (SELECT system_identifier::text FROM pg_control_system()) AS system_identifier,"
        " CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())"
        " ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
        " END AS timeline, current_database() AS database,"
        " (SELECT oid::int8 FROM pg_database WHERE datname = current_database()) AS database_oid,"
        " current_setting('server_version_num')::int AS server_version_num"
    ).fetchone()
    assert row is not None
    return dict(row)


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


def server_facts(conn: Conn) -> ServerFacts:
    """Version, recovery state and the replication settings, sizes in bytes."""
    head = conn.execute(
        "SELECT current_setting('server_version_num')::int AS version_num,"
        " current_setting('server_version') AS version,"
        " pg_is_in_recovery() AS in_recovery"
    ).fetchone()
    rows = conn.execute(
        "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)",
        (list(_SETTINGS),),
    ).fetchall()
    largest = conn.execute(
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


def instance_identity(conn: Conn) -> tuple[str, str]:
    """(postmaster start time, port): equal for two connections to one running server, and
    readable without privilege (unlike ``pg_control_system()``)."""
    row = conn.execute(
        "SELECT pg_postmaster_start_time()::text AS started, current_setting('port') AS port"
    ).fetchone()
    assert row is not None
    return row["started"], row["port"]


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
