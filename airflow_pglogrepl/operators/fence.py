"""The cutover's write fence on the publisher, and its release (the rollback path).

The fence stops the application's roles writing to the tables being moved, waits a grace period
for their open transactions, ends the ones left, and records the fence LSN: the publisher's WAL
position once no fenced write can commit any more. ``LsnCatchUpSensor`` then waits for the
subscription to confirm that LSN. What the fence changed is saved on the publisher itself (see
``airflow_pglogrepl.hooks.fence``), so the release restores exactly that, even after retries.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.operators.arguments import names, resolve_tables

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.models.fence import FenceApplied, FencedBackend
    from airflow_pglogrepl.tables import TableRef

TerminateMode = Literal["auto", "transactions", "sessions", "none"]
_TERMINATE_MODES = ("auto", "transactions", "sessions", "none")


class WriteFenceOperator(TaskBoundary, BaseOperator):
    """Stop named roles writing to the moved tables on the publisher; push the fence LSN.

    1. In one transaction: ``REVOKE INSERT, UPDATE, DELETE, TRUNCATE`` on the tables (and their
       partitions) from each role (``revoke_privileges``), and/or ``ALTER ROLE ... IN DATABASE
       ... SET default_transaction_read_only = on`` (``read_only``). With revoking, the fence is
       checked before it commits: a role that would still be able to write (a superuser,
       privileges through ``PUBLIC`` or a group role) fails the task and nothing is changed.
       Then (``guard``, on by default) a trigger on each table refuses the writes of the roles
       and their members whatever path they take: ``BEGIN READ WRITE`` past a read-only
       default, a ``SECURITY DEFINER`` function, a session that ran ``SET ROLE``
       (``postgres.fence_guard``). Putting it in waits for transactions that wrote to the tables:
       those still open after ``grace_period`` are ended (per ``terminate``), and a prepared
       transaction holding writes fails the task (``COMMIT``/``ROLLBACK PREPARED`` it first).
       What the fence does not stop is logged and returned under ``not_stopped``.
    2. Waits up to ``grace_period`` seconds for the roles' sessions that could still commit a
       write to finish, then ends the rest with ``pg_terminate_backend``: with ``terminate``
       ``"transactions"``, sessions in a transaction begun before the fence; ``"sessions"``:
       every session opened before it (needed when only ``read_only`` fences, since that setting
       reaches new sessions only); ``"auto"``: ``"sessions"`` for a read-only-only fence,
       ``"transactions"`` otherwise; ``"none"``: wait, terminate nothing, and fail if any remain.
    3. Records the fence LSN (``pg_current_wal_lsn()`` once everything committed is flushed).

    Pushes ``fence_lsn`` (XCom key and in the return value) for ``LsnCatchUpSensor``:
    ``target_lsn="{{ ti.xcom_pull(task_ids='write_fence', key='fence_lsn') }}"``. Running it
    again is harmless; ``WriteFenceReleaseOperator`` undoes it. The connection's role needs
    the right to revoke and grant on the tables, ``ALTER ROLE`` and ``pg_signal_backend``; a
    superuser has them all, and must not itself be one of the fenced roles.

    :param postgres_conn_id: Airflow connection of the publisher.
    :param roles: the application's login roles to fence.
    :param tables: tables to fence (``schema.table``; default schema ``public``).
    :param publication: fence every table of this publication too.
    :param revoke_privileges: revoke the write privileges the roles hold directly.
    :param read_only: make the roles' new sessions in this database read-only.
    :param grace_period: seconds open transactions get to finish before being ended.
    :param terminate: which sessions are ended after the grace period (see above).
    :param terminate_timeout: seconds to wait for each ended session to exit.
    :param guard: also put the guard trigger on the tables (needs the tables' owner or a
        superuser); without it, the write paths above stay open and are listed.
    :param database: the publisher database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "roles", "tables", "publication", "postgres_conn_id", "database",
    )  # fmt: skip
    ui_color = "#fadbd8"

    def __init__(
        self,
        *,
        postgres_conn_id: str,
        roles: str | Sequence[str],
        tables: str | Sequence[str] | None = None,
        publication: str | None = None,
        revoke_privileges: bool = True,
        read_only: bool = False,
        grace_period: float = 10.0,
        terminate: TerminateMode = "auto",
        terminate_timeout: float = 5.0,
        database: str | None = None,
        guard: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not revoke_privileges and not read_only:
            raise ValueError("WriteFenceOperator: set revoke_privileges, read_only or both")
        if terminate not in _TERMINATE_MODES:
            raise ValueError(f"terminate must be one of {_TERMINATE_MODES}, not {terminate!r}")
        if not roles:
            raise ValueError("WriteFenceOperator: name at least one role to fence")
        if not tables and not publication:
            raise ValueError("WriteFenceOperator: give tables, a publication, or both")
        self.postgres_conn_id = postgres_conn_id
        self.roles = roles
        self.tables = tables
        self.publication = publication
        self.revoke_privileges = revoke_privileges
        self.read_only = read_only
        self.grace_period = grace_period
        self.terminate = terminate
        self.terminate_timeout = terminate_timeout
        self.database = database
        self.guard = guard

    def execute(self, context: Context) -> dict[str, Any]:
        hook = replication_hook(self.postgres_conn_id, self.database)
        roles = names(self.roles)
        tables = resolve_tables(hook, names(self.tables), self.publication)
        server_version = hook.server_facts().version
        applied = hook.apply_write_fence(
            roles, tables, revoke=self.revoke_privileges, read_only=self.read_only
        )
        # The write downtime starts here, on the worker's clock. Pushed at once: the summary
        # must know the fence was applied even when a step below fails.
        write_fence_at = dt.datetime.now(dt.UTC)
        context["ti"].xcom_push(
            key=FENCE_APPLIED_KEY,
            value={"write_fence_at": write_fence_at.isoformat(), "server_version": server_version},
        )
        started = time.monotonic()
        terminated: list[dict[str, Any]] = []
        if self.guard:
            terminated += self._guard(hook, roles, tables)
        _refuse_prepared_writers(hook, tables)
        sessions = self._terminate_sessions()
        left = self._wait(hook, roles, applied.fenced_at, sessions)
        waited = time.monotonic() - started
        if left and self.terminate != "none":
            ended, left = self._end_left_sessions(
                hook, left, roles, fenced_at=applied.fenced_at, sessions=sessions
            )
            terminated += ended  # after those the guard ended: the summary names every one
        _refuse_open_sessions(applied, left)
        fence_lsn = self._mark_fence_lsn(hook, context, roles, applied)
        not_stopped = self._not_stopped()
        for path in not_stopped:
            self.log.warning("Write fence does not stop: %s", path)
        return {
            "guard": self.guard,
            "not_stopped": not_stopped,
            "fence_lsn": str(fence_lsn),
            "roles": roles,
            "revoke_privileges": self.revoke_privileges,
            "read_only": self.read_only,
            "waited_seconds": round(waited, 3),
            "terminated": terminated,
            "write_fence_at": write_fence_at.isoformat(),
            "server_version": server_version,
            **applied.to_dict(),
        }

    def _end_left_sessions(
        self,
        hook: PgLogicalReplicationHook,
        left: list[FencedBackend],
        roles: list[str],
        *,
        fenced_at: dt.datetime,
        sessions: bool,
    ) -> tuple[list[dict[str, Any]], list[FencedBackend]]:
        """End the sessions still open after the grace period; return those ended and those left."""
        gone = set(hook.terminate_backends([b.pid for b in left], timeout_s=self.terminate_timeout))
        terminated = [b.to_dict() for b in left if b.pid in gone]
        for backend in left:
            if backend.pid in gone:
                self.log.warning(
                    "Ended session %d of %s (%s, transaction since %s) after the grace period",
                    backend.pid, backend.role, backend.state, backend.xact_start,
                )  # fmt: skip
        return terminated, hook.fence_backends(roles, fenced_at=fenced_at, sessions=sessions)

    def _mark_fence_lsn(
        self,
        hook: PgLogicalReplicationHook,
        context: Context,
        roles: list[str],
        applied: FenceApplied,
    ) -> LSN:
        """Record the fence LSN on the publisher and push it (XCom ``fence_lsn``)."""
        fence_lsn = hook.mark_fence_lsn(
            {
                "roles": roles,
                "fenced_at": applied.fenced_at.isoformat(),
                "dag_run": _run_id(context),
            }
        )
        self.log.info(
            "Write fence holds on %d tables for roles %s; fence LSN %s", len(applied.tables),
            ", ".join(roles), fence_lsn,
        )  # fmt: skip
        context["ti"].xcom_push(key="fence_lsn", value=str(fence_lsn))
        return fence_lsn

    def _guard(
        self, hook: PgLogicalReplicationHook, roles: list[str], tables: list[TableRef]
    ) -> list[dict[str, Any]]:
        """Put the guard in: wait ``grace_period`` for writers, end them, try once more."""
        from airflow_pglogrepl.exceptions import FenceNotHeldError

        outcome = hook.guard_write_fence(roles, tables, lock_timeout_s=max(0.1, self.grace_period))
        terminated: list[dict[str, Any]] = []
        if not outcome.installed:
            prepared = [h for h in outcome.holders if h["gid"] is not None]
            holders = [h for h in outcome.holders if h["pid"] is not None]
            others = [h for h in holders if h["role"] not in outcome.members]
            # only the fenced roles' sessions are ended: another role's transaction (a DBA's
            # VACUUM or CREATE INDEX CONCURRENTLY, an unfenced writer) is not the fence's to kill
            if holders and not prepared and not others and self.terminate != "none":
                gone = set(hook.terminate_backends([h["pid"] for h in holders],
                                                   timeout_s=self.terminate_timeout))  # fmt: skip
                for holder in holders:
                    if holder["pid"] in gone:
                        self.log.warning(
                            "Ended session %d of %s: its transaction wrote to %s before the "
                            "fence and was still open after the grace period",
                            holder["pid"], holder["role"], holder["relation"],
                        )  # fmt: skip
                        terminated.append({k: _plain(v) for k, v in holder.items() if k != "gid"})
                outcome = hook.guard_write_fence(
                    roles, tables, lock_timeout_s=max(1.0, self.terminate_timeout)
                )
        if not outcome.installed:
            raise FenceNotHeldError(
                "write fence: the guard could not be put on the tables, because these hold "
                "writes (or DDL locks) on them: "
                + ", ".join(
                    f"prepared transaction {h['gid']!r}"
                    if h["gid"] is not None
                    else f"pid {h['pid']} ({h['role']}, {h['state']})"
                    for h in outcome.holders
                )
                + " (on "
                + ", ".join(sorted({str(h["relation"]) for h in outcome.holders}))
                + "). Sessions of roles that are not fenced are never ended by the fence. Fix: "
                "let them finish or end them (COMMIT/ROLLBACK PREPARED for prepared "
                "transactions, pg_terminate_backend for sessions), then run the fence again; "
                "WriteFenceReleaseOperator undoes what it changed"
            )
        self.log.info("Write fence guard on %d tables for %s", len(tables),
                      ", ".join(outcome.members))  # fmt: skip
        return terminated

    def _not_stopped(self) -> list[str]:
        from airflow_pglogrepl.postgres.fence_guard import NOT_STOPPED

        if self.guard:
            return list(NOT_STOPPED)
        paths = ["a SECURITY DEFINER function owned by a role that is not fenced (guard=False)"]
        if not self.revoke_privileges:
            paths.insert(
                0,
                "a transaction that runs BEGIN READ WRITE or SET transaction_read_only = off "
                "(read_only is only a default; guard=False)",
            )
        return paths

    def _terminate_sessions(self) -> bool:
        if self.terminate == "auto":
            return self.read_only and not self.revoke_privileges
        return self.terminate == "sessions"

    def _wait(
        self,
        hook: PgLogicalReplicationHook,
        roles: list[str],
        fenced_at: dt.datetime,
        sessions: bool,
    ) -> list[FencedBackend]:
        deadline = time.monotonic() + max(0.0, float(self.grace_period))
        interval = 0.1
        while True:
            left = hook.fence_backends(roles, fenced_at=fenced_at, sessions=sessions)
            remaining = deadline - time.monotonic()
            if not left or remaining <= 0:
                return left
            self.log.info(
                "Waiting up to %.0fs for %d session(s) of the fenced roles to finish",
                remaining, len(left),
            )  # fmt: skip
            time.sleep(min(interval, remaining))
            interval = min(interval * 2, 1.0)


class WriteFenceReleaseOperator(TaskBoundary, BaseOperator):
    """Undo the write fence: give back exactly the privileges and setting it took.

    Reads the state the fence saved on the publisher (per role and database), re-grants what was
    revoked (``WITH GRANT OPTION`` where it was held), restores or resets the roles'
    ``default_transaction_read_only`` in this database, and removes the saved state. A role that
    is not fenced is reported, not an error, so it is safe as a rollback step that may run twice
    (for example with ``trigger_rule="one_failed"`` after the gates that follow the fence).

    :param postgres_conn_id: Airflow connection of the publisher.
    :param roles: roles to release (default: every role fenced in this database).
    :param database: the publisher database, when not the connection's.
    """

    template_fields: Sequence[str] = ("roles", "postgres_conn_id", "database")
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        postgres_conn_id: str,
        roles: str | Sequence[str] | None = None,
        database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.postgres_conn_id = postgres_conn_id
        self.roles = roles
        self.database = database

    def execute(self, context: Context) -> dict[str, Any]:
        hook = replication_hook(self.postgres_conn_id, self.database)
        roles = names(self.roles) if self.roles else None
        released = hook.release_write_fence(roles)
        return {
            "released": [r.to_dict() for r in released],
            "roles_released": [r.role for r in released if r.fenced],
            "roles_not_fenced": [r.role for r in released if not r.fenced],
        }


# XCom key WriteFenceOperator pushes the moment the fence is applied (CutoverSummaryOperator).
FENCE_APPLIED_KEY = "fence_applied"


def _refuse_prepared_writers(hook: PgLogicalReplicationHook, tables: list[TableRef]) -> None:
    """Fail when a prepared transaction holds writes to the fenced tables: it would commit them
    after the fence."""
    from airflow_pglogrepl.exceptions import FenceNotHeldError

    prepared = hook.fence_prepared_writers(tables)
    if prepared:
        raise FenceNotHeldError(
            "write fence is in place but prepared transaction(s) hold writes to fenced "
            "tables and would commit them after it: "
            + ", ".join(f"{p['gid']!r} (on {p['relation']})" for p in prepared)
            + ". Fix: COMMIT PREPARED or ROLLBACK PREPARED each (pg_prepared_xacts) and "
            "run the fence again; WriteFenceReleaseOperator undoes the fence"
        )


def _refuse_open_sessions(applied: FenceApplied, left: list[FencedBackend]) -> None:
    """Fail when sessions of the fenced roles that may still commit writes are left."""
    from airflow_pglogrepl.exceptions import FenceNotHeldError

    if left:
        raise FenceNotHeldError(
            f"write fence on {len(applied.tables)} tables is in place but {len(left)} "
            f"session(s) of the fenced roles may still commit writes: "
            + ", ".join(f"pid {b.pid} ({b.role}, {b.state})" for b in left)
            + ". Fix: end them (pg_terminate_backend needs pg_signal_backend), or set "
            "terminate='transactions'/'sessions'; WriteFenceReleaseOperator undoes the fence"
        )


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def _run_id(context: Context) -> str | None:
    run = context.get("dag_run")
    return getattr(run, "run_id", None) if run is not None else None
