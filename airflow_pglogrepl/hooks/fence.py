"""The write fence on the publisher: revoke writes, guard them, release exactly what was taken
(the statements: ``postgres/fence.py`` and ``postgres/fence_guard.py``; the records:
``models/fence.py``).

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
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.exceptions import FenceLockBusyError, FenceNotHeldError, PrivilegeError
from airflow_pglogrepl.hooks.base import PgSessionHook, run_ddl
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.fence import (
    FENCE_MESSAGE_PREFIX,
    FENCE_PRIVILEGES,
    FENCE_STATE_NAME,
    FENCE_STATE_SETTING,
    READ_ONLY_SETTING,
    FenceApplied,
    FencedBackend,
    FenceGrant,
    FenceReleased,
    GuardOutcome,
    RoleFence,
    grouped,
    parse_role_settings,
)
from airflow_pglogrepl.postgres import fence
from airflow_pglogrepl.postgres.fence_guard import (
    GuardHijackedError,
    fenced_members,
    guarded_tables,
    install_guard,
    lock_holders,
    remove_guard,
)
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features

# The records were defined here first: their names stay importable from this module.
__all__ = [
    "FENCE_MESSAGE_PREFIX",
    "FENCE_PRIVILEGES",
    "FENCE_STATE_NAME",
    "FENCE_STATE_SETTING",
    "READ_ONLY_SETTING",
    "FenceApplied",
    "FenceGrant",
    "FenceMixin",
    "FenceReleased",
    "FencedBackend",
    "GuardOutcome",
    "RoleFence",
    "parse_role_settings",
]


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
            database = fence.current_database(conn)
            me = fence.current_user(conn)
            if me in roles:
                raise ValueError(
                    f"cannot fence role {me!r}: this connection logs in as it and would lock "
                    f"itself out of the release; connect as another role (a superuser)"
                )
            oids = fence.role_oids(conn, roles)
            relations = fence.fence_relations(conn, tables)
            saved = fence.fence_states(conn)
            states: list[RoleFence] = []
            changes: list[str] = []
            for role in roles:
                before = saved.get(role, RoleFence(role))
                state = before
                if revoke:
                    taken = fence.revoke(conn, role, oids[role], relations)
                    state = state.with_grants(taken)
                    changes += [f"revoked {g.privilege} on {g.table} from {role}" for g in taken]
                if read_only and not state.read_only_set:
                    previous = fence.role_setting(conn, role, READ_ONLY_SETTING)
                    run_ddl(
                        conn,
                        fence.set_role_statement(role, database, READ_ONLY_SETTING, sql.SQL("on")),
                    )
                    state = RoleFence(role, True, previous, state.grants)
                    changes.append(f"{READ_ONLY_SETTING} = on for {role} in {database}")
                if state != before or role not in saved:
                    saved_text = sql.Literal(state.to_json())
                    run_ddl(
                        conn,
                        fence.set_role_statement(role, database, FENCE_STATE_SETTING, saved_text),
                    )
                states.append(state)
            if revoke:
                leaks = fence.leaks(conn, [oids[r] for r in roles], list(relations))
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
            fenced_at = fence.clock_timestamp(conn)
            conn.rollback()
        for change in changes:
            self.log.info("Write fence: %s", change)
        return FenceApplied(
            fenced_at=fenced_at,
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
            relations = fence.fence_relations(conn, tables)
            fenced = sorted(set(roles) | set(fence.fence_states(conn)))
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
                role = fence.current_user(conn)
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
            relations = fence.fence_relations(conn, tables)
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
            database = fence.current_database(conn)
            saved = fence.fence_states(conn)
            for role in roles if roles is not None else sorted(saved):
                state = saved.get(role)
                if state is None:
                    results.append(FenceReleased(role, fenced=False))
                    continue
                existing = fence.existing_tables(conn, {g.table for g in state.grants})
                restored: list[FenceGrant] = []
                for (table, grantable), privileges in grouped(state.grants).items():
                    if table not in existing:
                        continue
                    run_ddl(conn, fence.grant_statement(table, privileges, role, grantable))
                    restored += [FenceGrant(table, p, grantable) for p in privileges]
                restored_to: str | None = None
                if state.read_only_set:
                    previous = state.previous_read_only
                    value = sql.SQL("DEFAULT") if previous is None else sql.Literal(previous)
                    run_ddl(
                        conn, fence.set_role_statement(role, database, READ_ONLY_SETTING, value)
                    )
                    restored_to = previous if previous is not None else "(reset)"
                run_ddl(
                    conn,
                    fence.set_role_statement(
                        role, database, FENCE_STATE_SETTING, sql.SQL("DEFAULT")
                    ),
                )
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
            return fence.sessions_that_could_write(
                conn, members, fenced_at=fenced_at, sessions=sessions
            )

    def terminate_backends(self, pids: Sequence[int], *, timeout_s: float = 5.0) -> list[int]:
        """``pg_terminate_backend`` each pid, waiting up to ``timeout_s`` for each to exit.

        Returns the pids that are gone. Their open transactions roll back.
        """
        if not pids:
            return []
        with self.session() as conn:
            return fence.terminate_backends(conn, pids, timeout_s)

    def mark_fence_lsn(self, note: Mapping[str, Any]) -> LSN:
        """The publisher's WAL position once everything committed before now is on disk.

        A transactional ``pg_logical_emit_message`` (prefix ``pglogrepl.fence``) is committed
        with ``synchronous_commit = local`` first: that flushes the WAL up to its commit record,
        so an earlier commit made with ``synchronous_commit = off`` lies before the returned LSN
        too. pgoutput subscriptions ignore the message (``messages`` is off for them).
        """
        with self.session(autocommit=False) as conn:
            try:
                fence.emit_fence_message(conn, note)
            except pgerr.InsufficientPrivilege:
                # without the message no commit record is written, so nothing flushes the
                # WAL: a fence LSN read now could lie past WAL the subscriber is never sent
                conn.rollback()
                role = fence.current_user(conn)
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
            position = fence.wal_position(conn)
            conn.rollback()
        return position
