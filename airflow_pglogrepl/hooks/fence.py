"""The write fence's statements: revoke writes, guard them, release exactly what was taken.

A write fence lives in the publisher's catalogs, not in Airflow: what it revoked and which role
setting it replaced are stored per role and database as the placeholder setting
``pglogrepl.fence_state`` (``ALTER ROLE ... IN DATABASE ... SET``), in the same transaction as
the ``REVOKE``s. So a retried or repeated fence never forgets the grants of its first run, and the
release restores exactly what was taken, whoever runs it. Role settings are catalog rows: logical
replication does not carry them, and a ``FOR ALL TABLES`` publication does not see them.
See https://www.postgresql.org/docs/15/sql-alterrole.html
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.exceptions import (
    FenceLockBusyError,
    FenceNotHeldError,
    ObjectNotFoundError,
    PrivilegeError,
)
from airflow_pglogrepl.hooks.base import Conn, PgSessionHook, run_ddl
from airflow_pglogrepl.hooks.fence_guard import (
    GuardHijackedError,
    fenced_members,
    guarded_tables,
    install_guard,
    lock_holders,
    remove_guard,
)
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import Record
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features

FENCE_STATE_SETTING = ("pglogrepl", "fence_state")
FENCE_STATE_NAME = ".".join(FENCE_STATE_SETTING)
FENCE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
FENCE_MESSAGE_PREFIX = "pglogrepl.fence"
READ_ONLY_SETTING = "default_transaction_read_only"


@dataclass(frozen=True, order=True)
class FenceGrant(Record):
    """One table privilege the fence took from a role (and gives back on release)."""

    table: TableRef
    privilege: str
    grantable: bool = False


@dataclass(frozen=True)
class RoleFence(Record):
    """What the fence changed for one role in one database; release restores exactly this.

    ``previous_read_only`` is the role's own ``default_transaction_read_only`` setting in this
    database before the fence (``None``: it had none), meaningful when ``read_only_set``.
    """

    role: str
    read_only_set: bool = False
    previous_read_only: str | None = None
    grants: tuple[FenceGrant, ...] = ()

    def to_json(self) -> str:
        """The compact text stored in ``pglogrepl.fence_state``."""
        return json.dumps(
            {
                "v": 1,
                "ro": self.read_only_set,
                "prev": self.previous_read_only,
                "grants": [
                    [g.table.schema, g.table.name, g.privilege, g.grantable] for g in self.grants
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, role: str, text: str) -> RoleFence:
        """Parse what ``to_json`` stored; an unknown format version raises ``ValueError``."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError(f"role {role!r}: unknown {FENCE_STATE_NAME} format {text[:80]!r}")
        return cls(
            role=role,
            read_only_set=bool(data.get("ro")),
            previous_read_only=data.get("prev"),
            grants=tuple(
                sorted(FenceGrant(TableRef(s, n), str(p), bool(g)) for s, n, p, g in data["grants"])
            ),
        )

    def with_grants(self, grants: Iterable[FenceGrant]) -> RoleFence:
        """This state plus ``grants`` (one entry per table and privilege)."""
        merged = {(g.table, g.privilege): g for g in self.grants}
        for grant in grants:
            merged.setdefault((grant.table, grant.privilege), grant)
        return RoleFence(
            self.role, self.read_only_set, self.previous_read_only, tuple(sorted(merged.values()))
        )


@dataclass(frozen=True)
class FenceApplied(Record):
    """The fence after ``apply_write_fence``: saved state per role and what this call changed.

    ``fenced_at`` is the server's clock just after the fence committed: a transaction that
    started later cannot write to the fenced tables (revoke) or starts read-only (read_only).
    """

    fenced_at: dt.datetime
    tables: tuple[TableRef, ...]
    states: tuple[RoleFence, ...]
    changes: tuple[str, ...]

    dict_names = {"states": "saved"}


@dataclass(frozen=True)
class FenceReleased(Record):
    """What releasing the fence of one role restored (``restored`` is empty when not fenced)."""

    role: str
    fenced: bool
    restored: tuple[FenceGrant, ...] = ()
    read_only_restored_to: str | None = None
    missing_tables: tuple[TableRef, ...] = ()


@dataclass(frozen=True)
class FencedBackend(Record):
    """A session of a fenced role that could still commit a write (see ``fence_backends``)."""

    pid: int
    role: str
    state: str | None
    xact_start: dt.datetime | None
    backend_start: dt.datetime
    application_name: str


@dataclass(frozen=True)
class GuardOutcome(Record):
    """What ``guard_write_fence`` did: ``installed``, or the lock ``holders`` it waited for
    (``pid`` and ``gid``: a prepared transaction has no pid)."""

    installed: bool
    members: tuple[str, ...]
    holders: tuple[dict[str, Any], ...]


class FenceMixin(PgSessionHook):
    """The write fence on the publisher (the old primary of a cutover)."""

    # -- write fence (publisher) ------------------------------------------------------------

    def apply_write_fence(
        self,
        roles: Sequence[str],
        tables: Sequence[TableRef],
        *,
        revoke: bool = True,
        read_only: bool = False,
    ) -> FenceApplied:
        """Stop ``roles`` writing to ``tables``, in one transaction, and save what was changed.

        ``revoke``: ``REVOKE INSERT, UPDATE, DELETE, TRUNCATE`` (only what each role holds
        directly). ``read_only``: ``ALTER ROLE ... IN DATABASE ... SET
        default_transaction_read_only = on`` (new sessions only; the caller ends old ones).
        Partitioned tables are fenced with their partitions and ancestors (a write through either
        reaches the other). With ``revoke``, the fence is checked before commit: a role that could
        still write (superuser, privileges through ``PUBLIC``, a group role or column grants)
        raises ``FenceNotHeldError`` and nothing changes. Repeating the call is harmless: the
        saved state grows, it is never overwritten.
        """
        if not revoke and not read_only:
            raise ValueError("a write fence needs revoke=True, read_only=True or both")
        with self.session(autocommit=False) as conn:
            database = _current_database(conn)
            me = _scalar(conn, "SELECT current_user AS v")
            if me in roles:
                raise ValueError(
                    f"cannot fence role {me!r}: this connection logs in as it and would lock "
                    f"itself out of the release; connect as another role (a superuser)"
                )
            oids = _role_oids(conn, roles)
            relations = _fence_relations(conn, tables)
            saved = _fence_states(conn)
            states: list[RoleFence] = []
            changes: list[str] = []
            for role in roles:
                before = saved.get(role, RoleFence(role))
                state = before
                if revoke:
                    taken = _revoke(conn, role, oids[role], relations)
                    state = state.with_grants(taken)
                    changes += [f"revoked {g.privilege} on {g.table} from {role}" for g in taken]
                if read_only and not state.read_only_set:
                    previous = _role_setting(conn, role, READ_ONLY_SETTING)
                    run_ddl(conn, _set_role(role, database, READ_ONLY_SETTING, sql.SQL("on")))
                    state = RoleFence(role, True, previous, state.grants)
                    changes.append(f"{READ_ONLY_SETTING} = on for {role} in {database}")
                if state != before or role not in saved:
                    saved_text = sql.Literal(state.to_json())
                    run_ddl(conn, _set_role(role, database, FENCE_STATE_SETTING, saved_text))
                states.append(state)
            if revoke:
                leaks = _leaks(conn, [oids[r] for r in roles], list(relations))
                if leaks:
                    conn.rollback()
                    raise FenceNotHeldError(
                        "the write fence would not hold, so nothing was changed: "
                        + "; ".join(leaks[:20])
                        + (f"; and {len(leaks) - 20} more" if len(leaks) > 20 else "")
                        + ". Fix: fence the roles that really hold these privileges (the group "
                        "role, PUBLIC grants revoked by hand), or use read_only=True for roles "
                        "that cannot lose them (superusers)"
                    )
            conn.commit()
            fenced_at = conn.execute("SELECT clock_timestamp() AS v").fetchone()
            conn.rollback()
        assert fenced_at is not None
        for change in changes:
            self.log.info("Write fence: %s", change)
        return FenceApplied(
            fenced_at=fenced_at["v"],
            tables=tuple(relations.values()),
            states=tuple(states),
            changes=tuple(changes),
        )

    def guard_write_fence(
        self, roles: Sequence[str], tables: Sequence[TableRef], *, lock_timeout_s: float
    ) -> GuardOutcome:
        """Put the guard trigger (``fence_guard``) on ``tables`` and their partitions, for
        ``roles``, every role already fenced here, and their members. Waits at most
        ``lock_timeout_s`` for transactions that wrote to them; when they do not end, nothing
        is changed and the outcome names who holds the locks (prepared transactions too)."""
        with self.session(autocommit=False) as conn:
            relations = _fence_relations(conn, tables)
            fenced = sorted(set(roles) | set(_fence_states(conn)))
            members = fenced_members(conn, fenced)
            try:
                install_guard(conn, [(t.schema, t.name) for t in relations.values()], members,
                              int(lock_timeout_s * 1000))  # fmt: skip
            except (pgerr.LockNotAvailable, pgerr.DeadlockDetected):
                conn.rollback()
                holders = lock_holders(conn, list(relations))
                conn.rollback()
                return GuardOutcome(False, tuple(members), tuple(holders))
            except GuardHijackedError as exc:
                conn.rollback()
                raise FenceNotHeldError(f"write fence: {exc}") from None
            except pgerr.InsufficientPrivilege as exc:
                conn.rollback()
                role = _scalar(conn, "SELECT current_user AS v")
                raise PrivilegeError(
                    role,
                    f"guard the fenced tables with a trigger ({exc.diag.message_primary})",
                    "connect as a superuser or the tables' owner (CREATE on the database for "
                    "the pglogrepl schema, TRIGGER on the tables), or set guard=False and "
                    "accept the write paths it leaves open (see the task log)",
                ) from None
            conn.commit()
        return GuardOutcome(True, tuple(members), ())

    def fence_prepared_writers(self, tables: Sequence[TableRef]) -> list[dict[str, Any]]:
        """Prepared transactions holding a write lock on ``tables``: a ``COMMIT PREPARED`` of
        one commits writes after the fence."""
        with self.session() as conn:
            relations = _fence_relations(conn, tables)
            return [h for h in lock_holders(conn, list(relations)) if h["gid"] is not None]

    def release_write_fence(self, roles: Sequence[str] | None = None) -> list[FenceReleased]:
        """Give back what the fence took from ``roles`` (default: every fenced role), exactly.

        Grants are re-granted (``WITH GRANT OPTION`` where they had it); the role's own
        ``default_transaction_read_only`` in this database is set back to its previous value or
        reset; the saved state is removed. A role that is not fenced is reported, not an error;
        a table dropped meanwhile is reported in ``missing_tables``.
        """
        results: list[FenceReleased] = []
        with self.session(autocommit=False) as conn:
            database = _current_database(conn)
            saved = _fence_states(conn)
            for role in roles if roles is not None else sorted(saved):
                state = saved.get(role)
                if state is None:
                    results.append(FenceReleased(role, fenced=False))
                    continue
                existing = _existing_tables(conn, {g.table for g in state.grants})
                restored: list[FenceGrant] = []
                for (table, grantable), privileges in _grouped(state.grants).items():
                    if table not in existing:
                        continue
                    run_ddl(conn, _grant(table, privileges, role, grantable))
                    restored += [FenceGrant(table, p, grantable) for p in privileges]
                restored_to: str | None = None
                if state.read_only_set:
                    previous = state.previous_read_only
                    value = sql.SQL("DEFAULT") if previous is None else sql.Literal(previous)
                    run_ddl(conn, _set_role(role, database, READ_ONLY_SETTING, value))
                    restored_to = previous if previous is not None else "(reset)"
                run_ddl(conn, _set_role(role, database, FENCE_STATE_SETTING, sql.SQL("DEFAULT")))
                missing = tuple(sorted({g.table for g in state.grants} - existing))
                results.append(
                    FenceReleased(role, True, tuple(sorted(restored)), restored_to, missing)
                )
            remaining = sorted(set(saved) - {r.role for r in results})
            guarded = guarded_tables(conn)
            try:
                if guarded and remaining:  # the others stay fenced: the guard keeps only them
                    install_guard(conn, guarded, fenced_members(conn, remaining), 10_000)
                elif guarded:
                    remove_guard(conn)
            except (pgerr.LockNotAvailable, pgerr.DeadlockDetected):
                conn.rollback()
                raise FenceLockBusyError(
                    "write fence release: the guard's triggers could not be changed within 10s "
                    "(a long query or transaction holds a lock on a fenced table). Nothing was "
                    "released: the fence stays in place. Fix: run the release again, or end "
                    "the blocking session (pg_locks, pg_stat_activity)"
                ) from None
            conn.commit()
        for released in results:
            self.log.info(
                "Write fence of %s released: %d privileges given back%s",
                released.role,
                len(released.restored),
                f", {READ_ONLY_SETTING} -> {released.read_only_restored_to}"
                if released.read_only_restored_to
                else "",
            )
        return results

    def fence_backends(
        self, roles: Sequence[str], *, fenced_at: dt.datetime, sessions: bool
    ) -> list[FencedBackend]:
        """Sessions of ``roles`` in this database that could still commit a write.

        Those with a transaction that began before ``fenced_at`` (it may hold writes made before
        the fence and commit them after); with ``sessions``, also every session opened before it
        (a read-only fence applies to new sessions only). A session counts when it logged in as
        one of ``roles`` or as a member of one: ``SET ROLE`` is not visible from outside.
        """
        with self.session() as conn:
            members = fenced_members(conn, roles)
            rows = conn.execute(
                "SELECT pid, usename AS role, state, xact_start, backend_start,"
                " coalesce(application_name, '') AS application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend' AND usename = ANY(%s)"
                " AND (xact_start <= %s OR (%s AND backend_start <= %s)) ORDER BY pid",
                (members, fenced_at, sessions, fenced_at),
            ).fetchall()
        return [FencedBackend(**row) for row in rows]

    def terminate_backends(self, pids: Sequence[int], *, timeout_s: float = 5.0) -> list[int]:
        """``pg_terminate_backend`` each pid, waiting up to ``timeout_s`` for each to exit.

        Returns the pids that are gone. Their open transactions roll back.
        """
        if not pids:
            return []
        with self.session() as conn:
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
        gone = {row["pid"] for row in rows} - {row["pid"] for row in alive}
        return sorted(gone)

    def mark_fence_lsn(self, note: Mapping[str, Any]) -> LSN:
        """The publisher's WAL position once everything committed before now is on disk.

        A transactional ``pg_logical_emit_message`` (prefix ``pglogrepl.fence``) is committed
        with ``synchronous_commit = local`` first: that flushes the WAL up to its commit record,
        so an earlier commit made with ``synchronous_commit = off`` lies before the returned LSN
        too. pgoutput subscriptions ignore the message (``messages`` is off for them).
        """
        with self.session(autocommit=False) as conn:
            conn.execute("SET LOCAL synchronous_commit = local")
            try:
                conn.execute(
                    "SELECT pg_logical_emit_message(true, %s, %s)",
                    (FENCE_MESSAGE_PREFIX, json.dumps(dict(note), default=str)),
                )
            except pgerr.InsufficientPrivilege:
                # without the message no commit record is written, so nothing flushes the
                # WAL: a fence LSN read now could lie past WAL the subscriber is never sent
                conn.rollback()
                role = _scalar(conn, "SELECT current_user AS v")
                raise PrivilegeError(
                    role,
                    "mark the fence LSN: it may not execute pg_logical_emit_message, whose "
                    "commit record flushes the WAL up to the fence",
                    f"GRANT EXECUTE ON FUNCTION "
                    f"{Features.of(conn.info.server_version).emit_message_signature} TO "
                    f"{sql.Identifier(role).as_string(conn)} in this database; the fence itself is "
                    f"in place (WriteFenceReleaseOperator undoes it)",
                ) from None
            conn.commit()
            row = conn.execute("SELECT pg_current_wal_lsn() AS lsn").fetchone()
            conn.rollback()
        assert row is not None
        return LSN(row["lsn"])


def parse_role_settings(setconfig: Sequence[str] | None) -> dict[str, str]:
    """``pg_db_role_setting.setconfig`` (``name=value`` items) as a dict."""
    result: dict[str, str] = {}
    for item in setconfig or ():
        name, sep, value = item.partition("=")
        if sep:
            result[name] = value
    return result


def _grouped(grants: Iterable[FenceGrant]) -> dict[tuple[TableRef, bool], list[str]]:
    groups: dict[tuple[TableRef, bool], list[str]] = {}
    for grant in sorted(grants):
        groups.setdefault((grant.table, grant.grantable), []).append(grant.privilege)
    return groups


def _scalar(conn: Conn, query: LiteralString) -> Any:
    row = conn.execute(query).fetchone()
    return None if row is None else row["v"]


def _current_database(conn: Conn) -> str:
    return str(_scalar(conn, "SELECT current_database() AS v"))


def _role_oids(conn: Conn, roles: Sequence[str]) -> dict[str, int]:
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


def _fence_relations(conn: Conn, tables: Sequence[TableRef]) -> dict[int, TableRef]:
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


def _direct_grants(
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


def _revoke(
    conn: Conn, role: str, role_oid: int, relations: Mapping[int, TableRef]
) -> list[FenceGrant]:
    """Revoke the role's direct write privileges; return those really gone (exactly)."""
    before = _direct_grants(conn, role_oid, relations)
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
    after = _direct_grants(conn, role_oid, relations)
    return sorted(
        FenceGrant(table, privilege, grantable)
        for (table, privilege), grantable in before.items()
        if (table, privilege) not in after
    )


def _leaks(conn: Conn, role_oids: Sequence[int], relation_oids: Sequence[int]) -> list[str]:
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


def _fence_states(conn: Conn) -> dict[str, RoleFence]:
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


def _role_setting(conn: Conn, role: str, name: str) -> str | None:
    row = conn.execute(
        "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE r.rolname = %s"
        " AND s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (role,),
    ).fetchone()
    return parse_role_settings(row["setconfig"] if row else None).get(name)


def _setting_name(name: str | tuple[str, ...]) -> sql.Composable:
    return sql.Identifier(*name) if isinstance(name, tuple) else sql.Identifier(name)


def _set_role(
    role: str, database: str, name: str | tuple[str, ...], value: sql.Composable
) -> sql.Composed:
    """``ALTER ROLE r IN DATABASE d SET name = value`` (``DEFAULT`` resets the setting)."""
    return sql.SQL("ALTER ROLE {} IN DATABASE {} SET {} = {}").format(
        sql.Identifier(role), sql.Identifier(database), _setting_name(name), value
    )


def _grant(table: TableRef, privileges: Sequence[str], role: str, grantable: bool) -> sql.Composed:
    return sql.SQL("GRANT {} ON TABLE {} TO {}{}").format(
        sql.SQL(", ").join(sql.SQL(p) for p in privileges if p in FENCE_PRIVILEGES),
        sql.Identifier(table.schema, table.name),
        sql.Identifier(role),
        sql.SQL(" WITH GRANT OPTION") if grantable else sql.SQL(""),
    )


def _existing_tables(conn: Conn, tables: Iterable[TableRef]) -> set[TableRef]:
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
