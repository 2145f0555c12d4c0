"""The write fence's statements, as functions of a psycopg connection: the tables a fence covers
(partitions and ancestors), a role's direct write grants and their revoke, what would still let a
role write, the fence state kept in role settings, the grants that give back what was taken, the
sessions that could still commit a write, and the message whose commit marks the fence's LSN.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, LiteralString

from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.exceptions import FenceNotHeldError, ObjectNotFoundError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.fence import (
    FENCE_MESSAGE_PREFIX,
    FENCE_PRIVILEGES,
    FENCE_STATE_NAME,
    FencedBackend,
    FenceGrant,
    RoleFence,
    parse_role_settings,
)
from airflow_pglogrepl.postgres.connect import Conn, run_ddl
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features


def scalar(conn: Conn, query: LiteralString) -> Any:
    row = conn.execute(query).fetchone()
    return None if row is None else row["v"]


def current_user(conn: Conn) -> str:
    return str(scalar(conn, "SELECT current_user AS v"))


def current_database(conn: Conn) -> str:
    return str(scalar(conn, "SELECT current_database() AS v"))


def role_oids(conn: Conn, roles: Sequence[str]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT rolname, oid::int AS oid FROM pg_roles WHERE rolname = ANY(%s)", (list(roles),)
    ).fetchall()
    found = {row["rolname"]: row["oid"] for row in rows}
    missing = [r for r in roles if r not in found]
    if missing:
        raise ObjectNotFoundError(
            "role", ", ".join(missing), "check the role names (case and quoting count)"
        )
    return found


def fence_relations(conn: Conn, tables: Sequence[TableRef]) -> dict[int, TableRef]:
    """Tables to fence by oid: the given ones, their partitions, and every table they inherit
    from (a partition's ancestors, and plain inheritance parents too: ``UPDATE parent`` and
    ``DELETE FROM parent`` change a child's rows, and check only the parent's privileges and
    triggers)."""
    if not tables:
        raise ValueError("a write fence needs at least one table")
    schemas, names = [t.schema for t in tables], [t.name for t in tables]
    found = conn.execute(
        "SELECT n.nspname AS schema, c.relname AS name FROM unnest(%s::text[], %s::text[])"
        " AS w(schema_name, table_name) JOIN pg_namespace n ON n.nspname = w.schema_name"
        " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name"
        " AND c.relkind IN ('r', 'p')",
        (schemas, names),
    ).fetchall()
    missing = set(tables) - {TableRef(r["schema"], r["name"]) for r in found}
    if missing:
        raise ObjectNotFoundError(
            "table", ", ".join(str(t) for t in sorted(missing)), "check the table list"
        )
    rows = conn.execute(
        "WITH RECURSIVE wanted AS (SELECT c.oid FROM unnest(%s::text[], %s::text[])"
        "  AS w(schema_name, table_name) JOIN pg_namespace n ON n.nspname = w.schema_name"
        "  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name),"
        " ancestors(relid) AS (SELECT oid FROM wanted"
        "  UNION SELECT i.inhparent FROM pg_inherits i JOIN ancestors a ON i.inhrelid = a.relid),"
        " related AS (SELECT relid FROM ancestors"
        "  UNION SELECT t.relid FROM wanted, pg_partition_tree(wanted.oid) t)"
        " SELECT c.oid::int AS oid, n.nspname AS schema, c.relname AS name FROM related r"
        " JOIN pg_class c ON c.oid = r.relid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('r', 'p') ORDER BY 2, 3",
        (schemas, names),
    ).fetchall()
    return {row["oid"]: TableRef(row["schema"], row["name"]) for row in rows}


def direct_grants(
    conn: Conn, role_oid: int, relations: Mapping[int, TableRef]
) -> dict[tuple[TableRef, str], bool]:
    rows = conn.execute(
        "SELECT c.oid::int AS oid, a.privilege_type AS privilege,"
        " bool_or(a.is_grantable) AS grantable FROM pg_class c"
        " CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a"
        " WHERE c.oid = ANY(%s::oid[]) AND a.grantee = %s::oid AND a.privilege_type = ANY(%s)"
        " GROUP BY 1, 2",
        (list(relations), role_oid, list(FENCE_PRIVILEGES)),
    ).fetchall()
    return {(relations[row["oid"]], row["privilege"]): row["grantable"] for row in rows}


def revoke(
    conn: Conn, role: str, role_oid: int, relations: Mapping[int, TableRef]
) -> list[FenceGrant]:
    """Revoke the role's direct write privileges; return those really gone (exactly)."""
    before = direct_grants(conn, role_oid, relations)
    if not before:
        return []
    by_table: dict[TableRef, list[str]] = {}
    for table, privilege in sorted(before):
        by_table.setdefault(table, []).append(privilege)
    for table, privileges in by_table.items():
        try:
            run_ddl(
                conn,
                sql.SQL("REVOKE {} ON TABLE {} FROM {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in privileges),
                    sql.Identifier(table.schema, table.name),
                    sql.Identifier(role),
                ),
            )
        except pgerr.DependentPrivilegeDescriptorsStillExist as exc:
            raise FenceNotHeldError(
                f"cannot revoke {', '.join(privileges)} on {table} from {role!r}: it granted "
                f"them on to other roles (WITH GRANT OPTION). Fix: fence those roles too after "
                f"revoking their grants by hand, or use read_only=True"
            ) from exc
    after = direct_grants(conn, role_oid, relations)
    return sorted(
        FenceGrant(table, privilege, grantable)
        for (table, privilege), grantable in before.items()
        if (table, privilege) not in after
    )


def leaks(conn: Conn, role_oids: Sequence[int], relation_oids: Sequence[int]) -> list[str]:
    rows = conn.execute(
        "SELECT r.rolname AS role, r.rolsuper AS superuser, n.nspname AS schema,"
        " c.relname AS name, p.priv FROM unnest(%s::oid[]) AS ro(oid)"
        " JOIN pg_roles r ON r.oid = ro.oid CROSS JOIN unnest(%s::oid[]) AS rel(oid)"
        " JOIN pg_class c ON c.oid = rel.oid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " CROSS JOIN unnest(%s::text[]) AS p(priv)"
        " WHERE CASE WHEN p.priv IN ('INSERT', 'UPDATE')"
        "  THEN has_any_column_privilege(r.oid, c.oid, p.priv)"
        "  ELSE has_table_privilege(r.oid, c.oid, p.priv) END"
        " ORDER BY 1, 3, 4, 5",
        (list(role_oids), list(relation_oids), list(FENCE_PRIVILEGES)),
    ).fetchall()
    leaks: list[str] = []
    for row in rows:
        why = (
            "is a superuser"
            if row["superuser"]
            else "still holds it through PUBLIC, a role it is a member of, another grantor or "
            "column privileges"
        )
        leaks.append(
            f"role {row['role']!r} can still {row['priv']} {TableRef(row['schema'], row['name'])}"
            f" ({why})"
        )
    return leaks


def fence_states(conn: Conn) -> dict[str, RoleFence]:
    rows = conn.execute(
        "SELECT r.rolname, s.setconfig FROM pg_db_role_setting s"
        " JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    states: dict[str, RoleFence] = {}
    for row in rows:
        text = parse_role_settings(row["setconfig"]).get(FENCE_STATE_NAME)
        if text is not None:
            states[row["rolname"]] = RoleFence.from_json(row["rolname"], text)
    return states


def role_setting(conn: Conn, role: str, name: str) -> str | None:
    row = conn.execute(
        "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE r.rolname = %s"
        " AND s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (role,),
    ).fetchone()
    return parse_role_settings(row["setconfig"] if row else None).get(name)


def _setting_name(name: str | tuple[str, ...]) -> sql.Composable:
    return sql.Identifier(*name) if isinstance(name, tuple) else sql.Identifier(name)


def set_role_statement(
    role: str, database: str, name: str | tuple[str, ...], value: sql.Composable
) -> sql.Composed:
    """``ALTER ROLE r IN DATABASE d SET name = value`` (``DEFAULT`` resets the setting)."""
    return sql.SQL("ALTER ROLE {} IN DATABASE {} SET {} = {}").format(
        sql.Identifier(role), sql.Identifier(database), _setting_name(name), value
    )


def grant_statement(
    table: TableRef, privileges: Sequence[str], role: str, grantable: bool
) -> sql.Composed:
    return sql.SQL("GRANT {} ON TABLE {} TO {}{}").format(
        sql.SQL(", ").join(sql.SQL(p) for p in privileges if p in FENCE_PRIVILEGES),
        sql.Identifier(table.schema, table.name),
        sql.Identifier(role),
        sql.SQL(" WITH GRANT OPTION") if grantable else sql.SQL(""),
    )


def existing_tables(conn: Conn, tables: Iterable[TableRef]) -> set[TableRef]:
    refs = list(tables)
    if not refs:
        return set()
    rows = conn.execute(
        "SELECT n.nspname AS schema, c.relname AS name FROM unnest(%s::text[], %s::text[])"
        " AS w(schema_name, table_name) JOIN pg_namespace n ON n.nspname = w.schema_name"
        " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name",
        ([t.schema for t in refs], [t.name for t in refs]),
    ).fetchall()
    return {TableRef(row["schema"], row["name"]) for row in rows}


def clock_timestamp(conn: Conn) -> dt.datetime:
    """The server's clock now (``clock_timestamp()``, not the transaction's start)."""
    value = scalar(conn, "SELECT clock_timestamp() AS v")
    assert isinstance(value, dt.datetime)
    return value


def sessions_that_could_write(
    conn: Conn, members: Sequence[str], *, fenced_at: dt.datetime, sessions: bool
) -> list[FencedBackend]:
    """Client sessions in this database logged in as one of ``members`` whose transaction began
    before ``fenced_at`` (with ``sessions``: every session opened before it)."""
    rows = conn.execute(
        "SELECT pid, usename AS role, state, xact_start, backend_start,"
        " coalesce(application_name, '') AS application_name FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend' AND usename = ANY(%s)"
        " AND (xact_start <= %s OR (%s AND backend_start <= %s)) ORDER BY pid",
        (list(members), fenced_at, sessions, fenced_at),
    ).fetchall()
    return [FencedBackend(**row) for row in rows]


def terminate_backends(conn: Conn, pids: Sequence[int], timeout_s: float) -> list[int]:
    """``pg_terminate_backend`` each pid (waiting up to ``timeout_s`` each where the server can);
    the pids that are gone."""
    if Features.of(conn.info.server_version).terminate_backend_timeout:
        rows = conn.execute(
            "SELECT p AS pid, pg_terminate_backend(p, %s) AS ok FROM unnest(%s::int[]) p",
            (int(timeout_s * 1000), list(pids)),
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT p AS pid, pg_terminate_backend(p) AS ok FROM unnest(%s::int[]) p",
            (list(pids),),
        ).fetchall()
    alive = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),)
    ).fetchall()
    return sorted({row["pid"] for row in rows} - {row["pid"] for row in alive})


def emit_fence_message(conn: Conn, note: Mapping[str, Any]) -> None:
    """In the caller's transaction: ``synchronous_commit = local`` and a transactional
    ``pg_logical_emit_message`` (prefix ``pglogrepl.fence``), so that its commit flushes the WAL
    up to its commit record (``InsufficientPrivilege`` passes)."""
    conn.execute("SET LOCAL synchronous_commit = local")
    conn.execute(
        "SELECT pg_logical_emit_message(true, %s, %s)",
        (FENCE_MESSAGE_PREFIX, json.dumps(dict(note), default=str)),
    )


def wal_position(conn: Conn) -> LSN:
    """``pg_current_wal_lsn()``: on the publisher, where its WAL is now."""
    row = conn.execute("SELECT pg_current_wal_lsn() AS lsn").fetchone()
    assert row is not None
    return LSN(row["lsn"])
