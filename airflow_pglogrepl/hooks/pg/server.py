"""Where the server's WAL stands, as statements on a psycopg connection."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_pglogrepl.hooks.pg.connect import Conn
from airflow_pglogrepl.lsn import LSN

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
    database after a rename). The lake records it with
    every commit, so a lake is never reconciled against another server's LSNs."""
    row = conn.execute(
        "SELECT (SELECT system_identifier::text FROM pg_control_system()) AS system_identifier,"
        " CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())"
        " ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
        " END AS timeline, current_database() AS database,"
        " (SELECT oid::int8 FROM pg_database WHERE datname = current_database()) AS database_oid"
    ).fetchone()
    assert row is not None
    return dict(row)
