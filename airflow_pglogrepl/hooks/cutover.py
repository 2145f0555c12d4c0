"""The cutover's statements: write fences, sequence values, table checksums, apply-error facts.

A write fence lives in the publisher's catalogs, not in Airflow: what it revoked and which role
setting it replaced are stored per role and database as the placeholder setting
``pglogrepl.fence_state`` (``ALTER ROLE ... IN DATABASE ... SET``), in the same transaction as
the ``REVOKE``s. So a retried or repeated fence never forgets the grants of its first run, and the
release restores exactly what was taken, whoever runs it. Role settings are catalog rows: logical
replication does not carry them, and a ``FOR ALL TABLES`` publication does not see them.
See https://www.postgresql.org/docs/15/sql-alterrole.html and
https://www.postgresql.org/docs/15/logical-replication-restrictions.html (sequences).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, LiteralString

from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.exceptions import FenceNotHeldError, ObjectNotFoundError, PrivilegeError
from airflow_pglogrepl.hooks.base import Conn, run_ddl
from airflow_pglogrepl.hooks.fence_guard import (
    GuardHijackedError,
    fenced_members,
    guarded_tables,
    install_guard,
    lock_holders,
    remove_guard,
)
from airflow_pglogrepl.hooks.pg.connect import TEXT_OUTPUT, set_session
from airflow_pglogrepl.hooks.slots import SlotsMixin
from airflow_pglogrepl.hooks.subscriptions import SubscriptionsMixin
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.names import publication_names_option
from airflow_pglogrepl.records import RelState
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features

FENCE_STATE_SETTING = ("pglogrepl", "fence_state")
FENCE_STATE_NAME = ".".join(FENCE_STATE_SETTING)
FENCE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
FENCE_MESSAGE_PREFIX = "pglogrepl.fence"
READ_ONLY_SETTING = "default_transaction_read_only"

# Row text must read the same on both servers: fix every setting that changes a type's output.
_STABLE_OUTPUT = {**TEXT_OUTPUT, "lc_monetary": "C"}


@dataclass(frozen=True, order=True)
class FenceGrant:
    """One table privilege the fence took from a role (and gives back on release)."""

    table: TableRef
    privilege: str
    grantable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"table": str(self.table), "privilege": self.privilege, "grantable": self.grantable}


@dataclass(frozen=True)
class RoleFence:
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "read_only_set": self.read_only_set,
            "previous_read_only": self.previous_read_only,
            "grants": [g.to_dict() for g in self.grants],
        }


@dataclass(frozen=True)
class FenceApplied:
    """The fence after ``apply_write_fence``: saved state per role and what this call changed.

    ``fenced_at`` is the server's clock just after the fence committed: a transaction that
    started later cannot write to the fenced tables (revoke) or starts read-only (read_only).
    """

    fenced_at: dt.datetime
    tables: tuple[TableRef, ...]
    states: tuple[RoleFence, ...]
    changes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "fenced_at": self.fenced_at.isoformat(),
            "tables": [str(t) for t in self.tables],
            "saved": [s.to_dict() for s in self.states],
            "changes": list(self.changes),
        }


@dataclass(frozen=True)
class FenceReleased:
    """What releasing the fence of one role restored (``restored`` is empty when not fenced)."""

    role: str
    fenced: bool
    restored: tuple[FenceGrant, ...] = ()
    read_only_restored_to: str | None = None
    missing_tables: tuple[TableRef, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "fenced": self.fenced,
            "restored": [g.to_dict() for g in self.restored],
            "read_only_restored_to": self.read_only_restored_to,
            "missing_tables": [str(t) for t in self.missing_tables],
        }


@dataclass(frozen=True)
class FencedBackend:
    """A session of a fenced role that could still commit a write (see ``fence_backends``)."""

    pid: int
    role: str
    state: str | None
    xact_start: dt.datetime | None
    backend_start: dt.datetime
    application_name: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "role": self.role,
            "state": self.state,
            "xact_start": self.xact_start.isoformat() if self.xact_start else None,
            "backend_start": self.backend_start.isoformat(),
            "application_name": self.application_name,
        }


@dataclass(frozen=True)
class GuardOutcome:
    """What ``guard_write_fence`` did: ``installed``, or the lock ``holders`` it waited for
    (``pid`` and ``gid``: a prepared transaction has no pid)."""

    installed: bool
    members: tuple[str, ...]
    holders: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class OwnedSequence:
    """A sequence behind an identity or serial column (``kind``: ``identity`` or ``serial``)."""

    sequence: TableRef
    table: TableRef
    column: str
    kind: str


@dataclass(frozen=True)
class SequenceState:
    """One row of ``pg_sequences``; ``last_value`` is ``None`` until ``nextval`` first ran."""

    sequence: TableRef
    last_value: int | None
    increment: int
    min_value: int
    max_value: int
    # ``last_value`` reads NULL both for a sequence never used and for one the role may not
    # read (it needs SELECT or USAGE): this tells them apart
    readable: bool = True


@dataclass(frozen=True)
class TableChecksum:
    """Row count and order-independent checksum of a table (see ``table_checksum``)."""

    rows: int
    checksum: int


@dataclass(frozen=True)
class SubscriptionErrors:
    """What the subscriber can tell, over SQL, about a subscription's apply and sync errors.

    The error text itself (and the failing transaction's finish LSN, in the line
    ``... in transaction <xid>, finished at <LSN>``) is only in the subscriber's server log.
    ``origin_lsn`` is the end of the last remote transaction applied (its replication origin);
    ``skip_lsn`` a pending ``ALTER SUBSCRIPTION ... SKIP`` (PostgreSQL 15+).
    """

    name: str
    exists: bool
    enabled: bool = False
    slot_name: str | None = None
    publications: tuple[str, ...] = ()
    apply_worker_pid: int | None = None
    sync_workers: tuple[TableRef, ...] = ()
    apply_error_count: int | None = None
    sync_error_count: int | None = None
    stats_reset: dt.datetime | None = None
    skip_lsn: LSN | None = None
    origin_lsn: LSN | None = None
    not_ready: tuple[RelState, ...] = ()
    # 18+: pg_stat_subscription_stats' conflict counters by kind (insert_exists, ...); None
    # before 18, where the server does not count them
    conflicts: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "subscription": self.name,
            "exists": self.exists,
            "enabled": self.enabled,
            "slot_name": self.slot_name,
            "publications": list(self.publications),
            "apply_worker_pid": self.apply_worker_pid,
            "sync_workers": [str(t) for t in self.sync_workers],
            "apply_error_count": self.apply_error_count,
            "sync_error_count": self.sync_error_count,
            "stats_reset": self.stats_reset.isoformat() if self.stats_reset else None,
            "skip_lsn": str(self.skip_lsn) if self.skip_lsn else None,
            "origin_lsn": str(self.origin_lsn) if self.origin_lsn else None,
            "not_ready": [rel.to_dict() for rel in self.not_ready],
            "conflicts": self.conflicts,
        }


@dataclass(frozen=True)
class PendingTransaction:
    """The first transaction the subscriber has not applied, as the publisher's slot holds it.

    ``finish_lsn`` is its commit record's LSN: what the subscriber log calls ``finished at`` and
    what ``ALTER SUBSCRIPTION ... SKIP (lsn = ...)`` takes. ``changes`` counts changes per table
    and kind (``insert``, ``update``, ``delete``, ``truncate``); ``complete`` is False when the
    peek stopped before its commit.
    """

    xid: int
    finish_lsn: LSN
    commit_time: dt.datetime
    changes: tuple[tuple[TableRef, str, int], ...]
    complete: bool = True

    @property
    def tables(self) -> tuple[TableRef, ...]:
        """The tables it changes, in the order they first appear."""
        return tuple(dict.fromkeys(table for table, _, _ in self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "xid": self.xid,
            "finish_lsn": str(self.finish_lsn),
            "commit_time": self.commit_time.isoformat(),
            "tables": [str(t) for t in self.tables],
            "changes": [{"table": str(t), "kind": k, "count": n} for t, k, n in self.changes],
            "complete": self.complete,
        }


class CutoverMixin(SubscriptionsMixin, SlotsMixin):
    """Fence writes, copy sequence values, checksum tables, read and skip apply errors."""

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
                raise FenceNotHeldError(
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

    # -- sequences --------------------------------------------------------------------------

    def owned_sequences(self, tables: Sequence[TableRef]) -> list[OwnedSequence]:
        """Sequences behind identity and serial columns of ``tables`` (``pg_depend``)."""
        if not tables:
            return []
        with self.session() as conn:
            rows = conn.execute(
                "SELECT sn.nspname AS seq_schema, s.relname AS seq_name, n.nspname AS schema,"
                " c.relname AS name, a.attname AS column, d.deptype::text AS deptype"
                " FROM unnest(%s::text[], %s::text[]) AS w(schema_name, table_name)"
                " JOIN pg_namespace n ON n.nspname = w.schema_name"
                " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name"
                " JOIN pg_depend d ON d.refobjid = c.oid"
                "  AND d.refclassid = 'pg_class'::regclass AND d.classid = 'pg_class'::regclass"
                "  AND d.deptype IN ('a', 'i')"
                " JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'"
                " JOIN pg_namespace sn ON sn.oid = s.relnamespace"
                " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.refobjsubid"
                " ORDER BY 3, 4, 5",
                ([t.schema for t in tables], [t.name for t in tables]),
            ).fetchall()
        return [
            OwnedSequence(
                sequence=TableRef(row["seq_schema"], row["seq_name"]),
                table=TableRef(row["schema"], row["name"]),
                column=row["column"],
                kind="identity" if row["deptype"] == "i" else "serial",
            )
            for row in rows
        ]

    def sequence_states(self, sequences: Sequence[TableRef]) -> dict[TableRef, SequenceState]:
        """``pg_sequences`` rows of ``sequences`` that exist (``last_value`` needs SELECT)."""
        if not sequences:
            return {}
        with self.session() as conn:
            rows = conn.execute(
                "SELECT q.schemaname, q.sequencename, q.last_value, q.increment_by, q.min_value,"
                " q.max_value, has_sequence_privilege(format('%%I.%%I', q.schemaname,"
                " q.sequencename), 'SELECT, USAGE') AS readable"
                " FROM unnest(%s::text[], %s::text[]) AS w(schema_name, seq_name)"
                " JOIN pg_sequences q ON q.schemaname = w.schema_name"
                " AND q.sequencename = w.seq_name",
                ([s.schema for s in sequences], [s.name for s in sequences]),
            ).fetchall()
        return {
            TableRef(row["schemaname"], row["sequencename"]): SequenceState(
                sequence=TableRef(row["schemaname"], row["sequencename"]),
                last_value=row["last_value"],
                increment=row["increment_by"],
                min_value=row["min_value"],
                max_value=row["max_value"],
                readable=row["readable"],
            )
            for row in rows
        }

    def column_max(self, table: TableRef, column: str) -> int | None:
        """``max(column)`` of ``table`` (an integer column), ``None`` when the table is empty."""
        with self.session() as conn:
            row = conn.execute(
                sql.SQL("SELECT max({})::numeric AS v FROM {}").format(
                    sql.Identifier(column), sql.Identifier(table.schema, table.name)
                )
            ).fetchone()
        return None if row is None or row["v"] is None else int(row["v"])

    def set_sequence(self, sequence: TableRef, value: int) -> None:
        """``setval(sequence, value, true)``: the next ``nextval`` returns ``value`` + increment."""
        with self.session() as conn:
            row = conn.execute(
                "SELECT setval(c.oid, %s, true) AS v FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'S'",
                (value, sequence.schema, sequence.name),
            ).fetchone()
        if row is None:
            raise ObjectNotFoundError("sequence", str(sequence), "check the sequence name")
        self.log.info("setval(%s, %d)", sequence, value)

    # -- table parity -----------------------------------------------------------------------

    def table_columns(self, tables: Sequence[TableRef]) -> dict[TableRef, tuple[str, ...]]:
        """Replicated columns of each table that exists, in column order.

        Dropped and generated columns are left out: logical replication does not carry
        generated values (PostgreSQL 15), the subscriber computes its own.
        """
        if not tables:
            return {}
        with self.session() as conn:
            rows = conn.execute(
                "SELECT n.nspname AS schema, c.relname AS name,"
                " coalesce(array_agg(a.attname::text ORDER BY a.attnum)"
                "  FILTER (WHERE a.attnum IS NOT NULL), '{}') AS columns"
                " FROM unnest(%s::text[], %s::text[]) AS w(schema_name, table_name)"
                " JOIN pg_namespace n ON n.nspname = w.schema_name"
                " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name"
                "  AND c.relkind IN ('r', 'p')"
                " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
                "  AND NOT a.attisdropped AND a.attgenerated = ''"
                " GROUP BY 1, 2",
                ([t.schema for t in tables], [t.name for t in tables]),
            ).fetchall()
        return {TableRef(row["schema"], row["name"]): tuple(row["columns"]) for row in rows}

    def table_checksum(self, table: TableRef, columns: Sequence[str]) -> TableChecksum:
        """Row count and the sum of each row's md5 folded to a signed 64-bit integer.

        Summing (not XOR) keeps duplicate rows from cancelling out, and md5 of the row's text
        form is the same on every platform (``hashtext`` differs between byte orders). The
        session fixes the settings that change text output (time zone, date and interval style,
        float digits, bytea, money), so equal rows give equal text on both servers; columns are
        listed by name, so column order on the two sides does not matter.
        """
        row_text = sql.SQL("ROW({})::text").format(
            sql.SQL(", ").join(sql.Identifier("t", c) for c in columns)
        )
        query = sql.SQL(
            "SELECT count(*) AS rows, coalesce(sum(('x' || left(md5({}), 16))::bit(64)::bigint"
            "::numeric), 0) AS checksum FROM {} AS t"
        ).format(row_text, sql.Identifier(table.schema, table.name))
        with self.session() as conn:
            set_session(conn, _STABLE_OUTPUT)
            row = conn.execute(query).fetchone()
        assert row is not None
        return TableChecksum(rows=int(row["rows"]), checksum=int(row["checksum"]))

    # -- apply errors (subscriber) ----------------------------------------------------------

    def subscription_errors(self, name: str) -> SubscriptionErrors:
        """Error counters, workers, origin progress and tables not ready of a subscription."""
        status = self.subscription_status(name)
        if not status.exists:
            return SubscriptionErrors(name=name, exists=False)
        with self.session() as conn:
            newer = Features.of(conn.info.server_version).subscription_skip
            head = conn.execute(
                sql.SQL(
                    "SELECT s.oid, s.subslotname, s.subpublications, {skip} AS skip_lsn,"
                    " {reset} AS stats_reset,"
                    " (SELECT min(w.pid) FROM pg_stat_subscription w WHERE w.subid = s.oid"
                    "  AND w.relid IS NULL AND w.pid IS NOT NULL) AS apply_pid,"
                    " (SELECT coalesce(jsonb_agg(jsonb_build_array(n.nspname, c.relname)), '[]')"
                    "  FROM pg_stat_subscription w JOIN pg_class c ON c.oid = w.relid"
                    "  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE w.subid = s.oid"
                    "  AND w.pid IS NOT NULL) AS sync_rels"
                    " FROM pg_subscription s WHERE s.subname = %s"
                    " AND s.subdbid = (SELECT oid FROM pg_database"
                    "  WHERE datname = current_database())"
                ).format(
                    skip=sql.SQL("nullif(s.subskiplsn, '0/0')" if newer else "NULL::pg_lsn"),
                    reset=sql.SQL(
                        "(SELECT st.stats_reset FROM pg_stat_subscription_stats st"
                        " WHERE st.subid = s.oid)"
                        if newer
                        else "NULL::timestamptz"
                    ),
                ),
                (name,),
            ).fetchone()
            if head is None:  # dropped between the two reads
                return SubscriptionErrors(name=name, exists=False)
            conflicts: dict[str, int] | None = None
            if Features.of(conn.info.server_version).conflict_counters:
                counted = conn.execute(
                    "SELECT to_jsonb(st) AS st FROM pg_stat_subscription_stats st"
                    " WHERE st.subid = %s",
                    (head["oid"],),
                ).fetchone()
                conflicts = {
                    key.removeprefix("confl_"): int(value)
                    for key, value in (counted["st"] if counted else {}).items()
                    if key.startswith("confl_")
                }
            origin: LSN | None = None
            with suppress(pgerr.InsufficientPrivilege):  # superusers (and grantees) only
                row = conn.execute(
                    "SELECT remote_lsn FROM pg_replication_origin_status WHERE external_id = %s",
                    (f"pg_{head['oid']}",),
                ).fetchone()
                origin = row["remote_lsn"] if row and int(row["remote_lsn"]) else None
        return SubscriptionErrors(
            name=name,
            exists=True,
            enabled=status.enabled,
            slot_name=head["subslotname"],
            publications=tuple(head["subpublications"]),
            apply_worker_pid=head["apply_pid"],
            sync_workers=tuple(TableRef(schema, rel) for schema, rel in head["sync_rels"]),
            apply_error_count=status.apply_error_count,
            sync_error_count=status.sync_error_count,
            stats_reset=head["stats_reset"],
            skip_lsn=head["skip_lsn"],
            origin_lsn=origin,
            not_ready=status.not_ready,
            conflicts=conflicts,
        )

    def pending_transaction(
        self,
        slot: str,
        publications: Sequence[str],
        *,
        applied_upto: LSN | None,
        max_changes: int = 100_000,
    ) -> PendingTransaction | None:
        """Peek the subscription's slot (on the publisher) for the first unapplied transaction.

        ``applied_upto`` is the subscriber's origin LSN (``SubscriptionErrors.origin_lsn``):
        transactions the subscriber applied but has not confirmed yet are passed over. Nothing
        is consumed. Raises ``SlotInUseError`` while the apply worker is connected: between its
        retries after an error (``wal_retrieve_retry_interval``) the slot is free.
        """
        options = {
            "proto_version": "1",
            "publication_names": publication_names_option(publications),
        }
        rows = self.peek_changes(
            slot, upto_lsn=None, options=options, binary=True, upto_nchanges=max_changes
        )
        try:
            return first_pending_transaction(
                (bytes(data) for _, _, data in rows if not isinstance(data, str)),
                applied_upto=applied_upto,
            )
        finally:
            close = getattr(rows, "close", None)  # a generator: ends the peek's session now
            if callable(close):
                close()

    def skip_transaction(self, name: str, lsn: LSN) -> str:
        """Skip the remote transaction finishing at ``lsn``; returns how (``skip`` or ``origin``).

        PostgreSQL 15+: ``ALTER SUBSCRIPTION ... SKIP (lsn = ...)``; the apply worker skips the
        transaction whose finish LSN is exactly ``lsn`` and clears ``subskiplsn``. Older servers:
        the subscription's replication origin is advanced to ``lsn`` with the subscription
        disabled (``pg_replication_origin_advance``), which skips everything up to it.
        See https://www.postgresql.org/docs/15/logical-replication-conflicts.html
        """
        with self.session() as conn:
            info = self._require(conn, name)
            ident = sql.Identifier(name)
            if Features.of(conn.info.server_version).subscription_skip:
                run_ddl(
                    conn,
                    sql.SQL("ALTER SUBSCRIPTION {} SKIP (lsn = {})").format(
                        ident, sql.Literal(str(lsn))
                    ),
                )
                self.log.info("ALTER SUBSCRIPTION %s SKIP (lsn = %s) done", name, lsn)
                return "skip"
            if info.enabled:
                run_ddl(conn, sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
            try:
                conn.execute(
                    "SELECT pg_replication_origin_advance('pg_' || s.oid, %s)"
                    " FROM pg_subscription s WHERE s.subname = %s AND s.subdbid ="
                    " (SELECT oid FROM pg_database WHERE datname = current_database())",
                    (lsn, name),
                )
            finally:
                if info.enabled:
                    run_ddl(conn, sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(ident))
        self.log.info("Replication origin of subscription %s advanced to %s", name, lsn)
        return "origin"

    def clear_skip(self, name: str) -> None:
        """``ALTER SUBSCRIPTION ... SKIP (lsn = NONE)``: withdraw a pending skip (PG 15+)."""
        with self.session() as conn:
            self._require(conn, name)
            run_ddl(
                conn,
                sql.SQL("ALTER SUBSCRIPTION {} SKIP (lsn = NONE)").format(sql.Identifier(name)),
            )

    def reset_subscription_error_stats(self, name: str) -> None:
        """``pg_stat_reset_subscription_stats``: apply and sync error counters back to zero."""
        with self.session() as conn:
            conn.execute(
                "SELECT pg_stat_reset_subscription_stats(s.oid) FROM pg_subscription s"
                " WHERE s.subname = %s AND s.subdbid ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())",
                (name,),
            )


# -- pure helpers ------------------------------------------------------------------------------


def first_pending_transaction(
    messages: Iterable[bytes], *, applied_upto: LSN | None
) -> PendingTransaction | None:
    """The first transaction in pgoutput ``messages`` (protocol 1) not yet applied.

    A transaction is applied when its finish LSN lies before ``applied_upto`` (the origin's
    position is the end of the last applied commit record). Pure: tested without a server.
    """
    from airflow_pglogrepl.pgoutput.decoder import decode_message
    from airflow_pglogrepl.pgoutput.messages import (
        BeginMessage,
        CommitMessage,
        DeleteMessage,
        InsertMessage,
        RelationMessage,
        TruncateMessage,
        UpdateMessage,
    )

    relations: dict[int, TableRef] = {}
    begin: BeginMessage | None = None
    counts: dict[tuple[TableRef, str], int] = {}

    def pending(complete: bool) -> PendingTransaction:
        assert begin is not None
        return PendingTransaction(
            xid=begin.xid,
            finish_lsn=begin.final_lsn,
            commit_time=begin.commit_ts,
            changes=tuple((t, k, n) for (t, k), n in counts.items()),
            complete=complete,
        )

    def count(relation_id: int, kind: str) -> None:
        table = relations.get(relation_id, TableRef("?", f"relation {relation_id}"))
        counts[(table, kind)] = counts.get((table, kind), 0) + 1

    for data in messages:
        message = decode_message(data)
        if isinstance(message, BeginMessage):
            begin, counts = message, {}
        elif isinstance(message, RelationMessage):
            relations[message.relation_id] = TableRef(message.namespace, message.name)
        elif isinstance(message, InsertMessage):
            count(message.relation_id, "insert")
        elif isinstance(message, UpdateMessage):
            count(message.relation_id, "update")
        elif isinstance(message, DeleteMessage):
            count(message.relation_id, "delete")
        elif isinstance(message, TruncateMessage):
            for relation_id in message.relation_ids:
                count(relation_id, "truncate")
        elif isinstance(message, CommitMessage) and begin is not None:
            if applied_upto is None or begin.final_lsn >= applied_upto:
                return pending(complete=True)
            begin = None
    if begin is not None and (applied_upto is None or begin.final_lsn >= applied_upto):
        return pending(complete=False)
    return None


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
