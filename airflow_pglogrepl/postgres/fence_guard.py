"""The write fence's guard: a trigger on each fenced table that refuses the fenced roles' writes.

Privileges and a read-only default stop a role only at the front door. A write still gets
through

- in a transaction that says ``BEGIN READ WRITE`` or ``SET transaction_read_only = off``
  (``default_transaction_read_only`` is only a default);
- through a ``SECURITY DEFINER`` function owned by a role that keeps its privileges (it runs
  with its owner's rights);
- from a session that logged in as another role and ran ``SET ROLE app``;
- in a transaction that wrote before the fence and commits after it, or was ``PREPARE``d and is
  committed later (``COMMIT PREPARED``).

The guard closes those. It is a statement-level ``BEFORE INSERT OR UPDATE OR DELETE OR
TRUNCATE`` trigger on every fenced table (partitions and ancestors included) that raises when
``session_user`` or ``current_user`` is a fenced role or a member of one; ``session_user`` is
who logged in, whatever ``SET ROLE`` or a ``SECURITY DEFINER`` function made ``current_user``.
``COPY FROM``, ``MERGE`` and ``INSERT ... ON CONFLICT`` fire the same triggers. Creating a
trigger takes ``SHARE ROW EXCLUSIVE``, which waits for every transaction that has written to the
table: once the guard is in, no open transaction holds an uncommitted write there, except a
prepared one, which keeps its locks until ``COMMIT``/``ROLLBACK PREPARED`` (so the fence
reports it and does not claim to hold).

Not stopped, and said so in the task log: a superuser or the table's owner can switch the
guard off (``ALTER TABLE ... DISABLE TRIGGER``, ``SET session_replication_role = replica``),
and a role made a member of a fenced role after the fence is not in its list. Logical
replication's apply workers run as ``replica`` and pass: replication into these tables (after
a finalize with reverse replication) is not a write by the application.
See https://www.postgresql.org/docs/15/sql-createtrigger.html and
https://www.postgresql.org/docs/15/explicit-locking.html
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from airflow_pglogrepl.exceptions import GuardHijackedError
from airflow_pglogrepl.postgres.connect import Conn

__all__ = [
    "GUARD_FUNCTION",
    "GUARD_SCHEMA",
    "GUARD_TRIGGER",
    "NOT_STOPPED",
    "GuardHijackedError",
    "fenced_members",
    "guarded_tables",
    "install_guard",
    "lock_holders",
    "remove_guard",
]


GUARD_SCHEMA = "pglogrepl"
GUARD_FUNCTION = "write_fence_guard"
GUARD_TRIGGER = "pglogrepl_write_fence"

NOT_STOPPED = (
    "a superuser or a fenced table's owner can switch the guard off (ALTER TABLE ... DISABLE "
    "TRIGGER, SET session_replication_role = replica)",
    "a role made a member of a fenced role after the fence is not in the guard's list",
)

# The guard itself: no table access, the roles in its arguments, every type named with its
# schema and pg_temp searched last (types are looked up there too: a session's own
# ``pg_temp.text`` must not change what the comparison means).
_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $guard$
BEGIN
    IF session_user::pg_catalog.text = ANY(TG_ARGV)
        OR current_user::pg_catalog.text = ANY(TG_ARGV) THEN
        RAISE EXCEPTION 'write fence: %.% is fenced for a cutover; % may not write to it',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, session_user
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'WriteFenceReleaseOperator lifts the fence';
    END IF;
    RETURN NULL;
END
$guard$
"""

# Sessions and prepared transactions holding a lock on a relation that conflicts with the
# trigger's SHARE ROW EXCLUSIVE (an uncommitted write, or DDL). A prepared transaction's locks
# have no pid; its own transaction id lock, under the same virtual transaction, names it.
_HOLDERS = """
SELECT DISTINCT l.pid, a.usename AS role, a.state, a.xact_start, a.backend_start,
    coalesce(a.application_name, '') AS application_name, p.gid,
    l.relation::regclass::text AS relation
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN pg_locks x ON l.pid IS NULL AND x.pid IS NULL AND x.locktype = 'transactionid'
    AND x.virtualtransaction = l.virtualtransaction
LEFT JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
WHERE l.locktype = 'relation' AND l.granted AND l.relation = ANY(%s::oid[])
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND l.mode IN ('RowExclusiveLock', 'ShareUpdateExclusiveLock', 'ShareLock',
                   'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
    AND l.pid IS DISTINCT FROM pg_backend_pid()
ORDER BY l.pid
"""


def fenced_members(conn: Conn, roles: Sequence[str]) -> list[str]:
    """``roles`` and every role that is a member of one, directly or not (what the guard
    compares ``session_user`` with: superusers are not members of everything here)."""
    rows = conn.execute(
        "WITH RECURSIVE m(oid) AS (SELECT oid FROM pg_roles WHERE rolname = ANY(%s)"
        " UNION SELECT a.member FROM pg_auth_members a JOIN m ON a.roleid = m.oid)"
        " SELECT r.rolname FROM m JOIN pg_roles r ON r.oid = m.oid ORDER BY 1",
        (list(roles),),
    ).fetchall()
    return [row["rolname"] for row in rows]


def install_guard(
    conn: Conn, relations: Sequence[tuple[str, str]], members: Sequence[str], lock_timeout_ms: int
) -> None:
    """In ``conn``'s open transaction: the guard function, and the trigger on each relation
    (replaced when there, with ``members`` as its list). Raises ``LockNotAvailable`` when the
    tables' locks are not had within ``lock_timeout_ms`` in all (the caller rolls back), and
    ``GuardHijackedError`` when the guard's schema belongs to a role that could remove it."""
    function = sql.Identifier(GUARD_SCHEMA, GUARD_FUNCTION)
    deadline = time.monotonic() + max(1, int(lock_timeout_ms)) / 1000
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(GUARD_SCHEMA)))
    owner = conn.execute(
        "SELECT r.rolname, r.rolsuper OR r.rolname = current_user AS trusted"
        " FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE n.nspname = %s",
        (GUARD_SCHEMA,),
    ).fetchone()
    if owner is None or not owner["trusted"]:
        raise GuardHijackedError(
            f"schema {GUARD_SCHEMA!r} exists and belongs to role "
            f"{owner['rolname'] if owner else '?'}, who could drop the fence's guard (DROP "
            f"FUNCTION ... CASCADE). Fix: drop or rename that schema, or give it to this "
            f"role or a superuser (ALTER SCHEMA {GUARD_SCHEMA} OWNER TO ...), then fence again"
        )
    conn.execute(sql.SQL(_FUNCTION).format(function=function))
    arguments = sql.SQL(", ").join(sql.Literal(m) for m in members)
    for schema, name in relations:
        remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (str(remaining_ms),))
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE TRIGGER {trigger} BEFORE INSERT OR UPDATE OR DELETE OR "
                "TRUNCATE ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {function}({args})"
            ).format(
                trigger=sql.Identifier(GUARD_TRIGGER),
                table=sql.Identifier(schema, name),
                function=function,
                args=arguments,
            )
        )


def remove_guard(conn: Conn, *, lock_timeout_ms: int = 10_000) -> list[str]:
    """In ``conn``'s open transaction: drop every guard trigger of this database, the function,
    and the schema when nothing else is in it; returns the tables it was on. ``DROP TRIGGER``
    takes ``ACCESS EXCLUSIVE``: each lock wait is bounded (``LockNotAvailable``, the caller
    rolls back), so a long query on a table cannot queue the application behind the release."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (str(int(lock_timeout_ms)),))
    tables = guarded_tables(conn)
    for schema, name in tables:
        conn.execute(
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                sql.Identifier(GUARD_TRIGGER), sql.Identifier(schema, name)
            )
        )
    conn.execute(
        sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier(GUARD_SCHEMA, GUARD_FUNCTION))
    )
    empty = conn.execute(
        "SELECT n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user) AND"
        " NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid) AND"
        " NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid) AND"
        " NOT EXISTS (SELECT 1 FROM pg_type t WHERE t.typnamespace = n.oid) AS v"
        " FROM pg_namespace n WHERE n.nspname = %s",
        (GUARD_SCHEMA,),
    ).fetchone()
    if empty and empty["v"]:
        conn.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(GUARD_SCHEMA)))
    return [f"{schema}.{name}" for schema, name in tables]


def guarded_tables(conn: Conn) -> list[tuple[str, str]]:
    """The tables that carry the guard trigger now."""
    rows = conn.execute(
        "SELECT n.nspname AS schema, c.relname AS name FROM pg_trigger t"
        " JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE t.tgname = %s ORDER BY 1, 2",
        (GUARD_TRIGGER,),
    ).fetchall()
    return [(row["schema"], row["name"]) for row in rows]


def lock_holders(conn: Conn, relids: Sequence[int]) -> list[dict[str, Any]]:
    """Sessions and prepared transactions (``gid`` set, ``pid`` None) holding a lock on one
    of ``relids`` that the guard's trigger creation waits for."""
    return list(conn.execute(_HOLDERS, (list(relids),)).fetchall())
