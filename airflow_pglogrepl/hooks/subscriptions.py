"""Subscriptions on the subscriber: read, create, reconcile, alter, drop, and their progress
(the statements: ``postgres/subscriptions.py``; the publisher's refusals the subscriber relays:
``postgres/errors.py``).

A statement that carries the publisher's password is sent only once the subscriber will keep it
out of every log and statistic (``postgres.secret_statements``), and its errors are re-raised
without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import (
    DefinitionConflictError,
    PasswordExposureError,
    PrivilegeError,
)
from airflow_pglogrepl.hooks.base import Conn, PgSessionHook, run_ddl
from airflow_pglogrepl.models.records import (
    Reconciled,
    Record,
    SubscriptionInfo,
    SubscriptionStatus,
)
from airflow_pglogrepl.postgres import subscriptions
from airflow_pglogrepl.postgres.errors import publisher_unreachable, subscription_statement_errors
from airflow_pglogrepl.postgres.secret_statements import quiet_secret_statements
from airflow_pglogrepl.postgres.subscriptions import (
    CREATE_OPTIONS,
    OPTION_SINCE,
    SETTABLE_OPTIONS,
    TARGET_KEYS,
)
from airflow_pglogrepl.versions import Features

__all__ = [
    "CREATE_OPTIONS",
    "OPTION_SINCE",
    "SETTABLE_OPTIONS",
    "TARGET_KEYS",
    "DropResult",
    "SubscriptionsMixin",
]


@dataclass(frozen=True)
class DropResult(Record):
    """What dropping a subscription did; ``slot_left_behind``: its slot left on the publisher;
    ``sync_slots_left_behind``: table-sync slots that may be left there too (tables that were
    not ready: their sync worker creates a slot of its own and drops it only when done)."""

    dropped: bool
    slot_left_behind: str | None = None
    reason: str | None = None
    sync_slots_left_behind: tuple[str, ...] = ()


class SubscriptionsMixin(PgSessionHook):
    """Subscriptions of the connected database (the subscriber side)."""

    # -- definition -----------------------------------------------------------------------

    def get_subscription(self, name: str, *, conn: Conn | None = None) -> SubscriptionInfo | None:
        """The subscription's definition (without the password), or ``None``."""
        with self._use(conn) as c:
            return subscriptions.read_subscription(c, name)

    def ensure_subscription(
        self,
        name: str,
        *,
        publisher_params: Mapping[str, str],
        publications: Sequence[str],
        options: Mapping[str, Any],
    ) -> Reconciled:
        """Create the subscription, or make an existing one match (a no-op when it does).

        ``publisher_params`` are libpq parameters as the *subscriber's server* will use them.
        An existing subscription pointing at another publisher (host, port, database or user)
        raises ``DefinitionConflictError``; a changed password is applied in place. A role that
        may not read ``subconninfo`` (a non-superuser owner, PostgreSQL 16+) can do neither:
        the connection is then left as it is, with a warning, never applied blindly.
        Publications and settable options are reconciled; ``enabled`` is left as it is (use
        ``enable_subscription``), because re-running a DAG must not undo a DBA's deliberate
        ``DISABLE``.
        """
        unknown = set(options) - CREATE_OPTIONS
        if unknown:
            raise ValueError(
                f"subscription {name!r}: unknown options {sorted(unknown)}; "
                f"known: {sorted(CREATE_OPTIONS)}"
            )
        if not publications:
            raise ValueError(f"subscription {name!r}: name at least one publication")
        dsn = conninfo.make_dsn(publisher_params)
        secrets = conninfo.secrets_of(publisher_params)
        with (
            self.session(secrets=secrets) as conn,
            subscription_statement_errors(secrets, publisher_params),
        ):
            _require_version(name, options, conn.info.server_version)
            _keep_password_home(conn, name, bool(secrets))
            current = self.get_subscription(name, conn=conn)
            if current is None:
                run_ddl(conn, subscriptions.create_statement(name, dsn, publications, options))
                return self._reconciled(name, "created", (f"publications {list(publications)}",))
            details = self._reconcile(conn, current, publisher_params, publications, options)
        return self._reconciled(name, "changed" if details else "unchanged", details)

    def _reconcile(
        self,
        conn: Conn,
        current: SubscriptionInfo,
        publisher_params: Mapping[str, str],
        publications: Sequence[str],
        options: Mapping[str, Any],
    ) -> tuple[str, ...]:
        name = current.name
        wanted = {k: str(publisher_params[k]) for k in TARGET_KEYS if publisher_params.get(k)}
        details: list[str] = []
        stored = subscriptions.stored_conninfo(conn, name)
        if current.target is None or stored is None:
            # A non-superuser owner (PostgreSQL 16+) may not read subconninfo: the stored
            # publisher cannot be compared. Applying the task's connection blindly could point
            # the subscription at another server: it is left alone.
            self.log.warning(
                "Subscription %s: pg_subscription.subconninfo is readable by superusers only, "
                "so whether it still points at %s is not checked and its connection is left "
                "as it is (a changed password or publisher is applied by a superuser, or by "
                "dropping and creating the subscription)",
                name,
                _target(wanted),
            )
        elif wanted != current.target:
            raise DefinitionConflictError(
                "subscription",
                name,
                f"points at {_target(current.target)} while this task asks for {_target(wanted)}",
                "drop it first (DropSubscriptionOperator) if the publisher really moved, or "
                "correct the publisher connection",
            )
        elif stored != dict(publisher_params):
            run_ddl(conn, subscriptions.connection_statement(name, publisher_params))
            details.append("connection options updated (values not shown)")
        if sorted(current.publications) != sorted(publications):
            refresh = current.enabled
            copy_data = bool(options.get("copy_data", True))
            run_ddl(conn, subscriptions.set_publications_statement(
                name, publications, refresh=refresh, copy_data=copy_data))  # fmt: skip
            details.append(f"publications {list(current.publications)} -> {list(publications)}")
        settable = {k: v for k, v in options.items() if k in SETTABLE_OPTIONS}
        changed = {k: v for k, v in settable.items() if _differs(current, k, v)}
        if changed:
            run_ddl(conn, subscriptions.set_options_statement(name, changed))
            details += [f"{k} -> {v}" for k, v in changed.items()]
        if not current.enabled:
            self.log.warning(
                "Subscription %s is disabled; left as it is (AlterSubscriptionOperator "
                "action='enable' turns it on)",
                name,
            )
        return tuple(details)

    def _reconciled(self, name: str, action: str, details: tuple[str, ...]) -> Reconciled:
        self.log.info("Subscription %s %s%s", name, action, "".join(f"\n  {d}" for d in details))
        return Reconciled("subscription", name, action, details)

    # -- alter ----------------------------------------------------------------------------

    def enable_subscription(self, name: str) -> None:
        """``ALTER SUBSCRIPTION ... ENABLE``: the apply worker starts."""
        self._alter(name, sql.SQL("ENABLE"))

    def disable_subscription(self, name: str) -> None:
        """``ALTER SUBSCRIPTION ... DISABLE``: the apply worker stops; the slot keeps WAL."""
        self._alter(name, sql.SQL("DISABLE"))

    def refresh_subscription(self, name: str, *, copy_data: bool = True) -> None:
        """``REFRESH PUBLICATION``: pick up tables added to (or dropped from) the publications."""
        self._alter(name, subscriptions.refresh_action(copy_data))

    def _alter(self, name: str, action: sql.Composable) -> None:
        with self.session() as conn:
            self._require(conn, name)
            run_ddl(conn, subscriptions.alter_statement(name, action))
        self.log.info("ALTER SUBSCRIPTION %s %s done", name, action.as_string(None))

    def _require(self, conn: Conn, name: str) -> SubscriptionInfo:
        from airflow_pglogrepl.exceptions import ObjectNotFoundError

        info = self.get_subscription(name, conn=conn)
        if info is None:
            raise ObjectNotFoundError(
                "subscription",
                name,
                "create it first (CreateSubscriptionOperator) or check the subscriber connection "
                "and database",
            )
        return info

    # -- drop -----------------------------------------------------------------------------

    def drop_subscription(self, name: str) -> DropResult:
        """Drop the subscription and, when the publisher answers, its slot there.

        When the publisher cannot be reached the subscription is detached from its slot
        (``DISABLE``, ``SET (slot_name = NONE)``) and dropped; the remote slot is returned as
        ``slot_left_behind``: it retains WAL on the publisher until someone drops it.
        """
        with self.session() as conn:
            info = self.get_subscription(name, conn=conn)
            if info is None:
                self.log.info("Subscription %s does not exist; nothing to drop", name)
                return DropResult(dropped=False)
            drop = subscriptions.drop_statement(name)
            try:
                run_ddl(conn, drop)
            except pgerr.Error as exc:
                if info.slot_name is None or not publisher_unreachable(exc):
                    raise
                reason = str(exc).strip().splitlines()[0]
                self.log.warning(
                    "Publisher unreachable while dropping subscription %s (%s); detaching its "
                    "slot %s and dropping the subscription without it",
                    name,
                    reason,
                    info.slot_name,
                )
                sync_slots = subscriptions.sync_slot_names(conn, name)
                if info.enabled:
                    run_ddl(conn, subscriptions.alter_statement(name, sql.SQL("DISABLE")))
                run_ddl(conn, subscriptions.detach_slot_statement(name))
                run_ddl(conn, drop)
                for slot in (info.slot_name, *sync_slots):
                    self.log.warning(
                        "Replication slot %s %s on the publisher and retains WAL until dropped "
                        "there: SELECT pg_drop_replication_slot('%s')",
                        slot, "is left" if slot == info.slot_name else "may be left", slot,
                    )  # fmt: skip
                return DropResult(
                    dropped=True,
                    slot_left_behind=info.slot_name,
                    reason=reason,
                    sync_slots_left_behind=sync_slots,
                )
        self.log.info("Dropped subscription %s (and its slot %s)", name, info.slot_name)
        return DropResult(dropped=True)

    # -- progress -------------------------------------------------------------------------

    def subscription_status(self, name: str) -> SubscriptionStatus:
        """Sync states of every table, worker presence, received LSNs and error counters."""
        with self.session() as conn:
            return subscriptions.subscription_status(conn, name)

    async def asubscription_status(self, name: str) -> SubscriptionStatus:
        """``subscription_status`` for triggers (non-blocking)."""
        async with self.asession() as conn:
            return await subscriptions.asubscription_status(conn, name)


def _target(target: Mapping[str, str]) -> str:
    return (
        f"{target.get('user', '?')}@{target.get('host', 'localhost')}:"
        f"{target.get('port', '5432')}/{target.get('dbname', '?')}"
    )


def _require_version(name: str, options: Mapping[str, Any], version_num: int) -> None:
    """Refuse, before anything is sent, options this server's version does not have."""
    used = {key for key in options if options[key] is not None}
    if str(options.get("streaming")).lower() == "parallel":
        used.add("streaming=parallel")
    major = Features.of(version_num).major
    newer = sorted(f"{key} (PostgreSQL {OPTION_SINCE[key]}+)" for key in used
                   if key in OPTION_SINCE and major < OPTION_SINCE[key])  # fmt: skip
    if newer:
        raise ValueError(
            f"subscription {name!r}: the subscriber runs PostgreSQL {major}, which has no "
            f"{', '.join(newer)}. Fix: leave them out, or subscribe from a newer subscriber"
        )


def _differs(current: SubscriptionInfo, key: str, value: Any) -> bool:
    have: dict[str, Any] = {
        "slot_name": current.slot_name,
        "synchronous_commit": current.synchronous_commit,
        "binary": current.binary,
        "streaming": current.streaming,
        **current.options,
    }
    if key not in have:
        return True
    if key == "streaming":
        wanted = {True: "on", False: "off"}.get(value, str(value).lower())
        return bool(wanted != have[key])
    if key == "origin":
        return str(value).lower() != str(have[key]).lower()
    return bool(have[key] != value)


def _keep_password_home(conn: Conn, name: str, has_password: bool) -> None:
    """Before a statement with the publisher's password is sent: make sure it will be kept in
    no log or statistics of the subscriber (``secret_statements``), or refuse. On PostgreSQL
    15 only superusers create subscriptions: a statement that fails for that would reach the
    log under the server's ``log_min_error_statement``, so it is refused here first."""
    role, superuser = subscriptions.role_may_create(conn)
    if not superuser and not Features.of(conn.info.server_version).non_superuser_subscriptions:
        raise PrivilegeError(
            role,
            f"create or alter subscription {name!r}: before PostgreSQL 16 that needs a superuser",
            "connect to the subscriber as a superuser (PostgreSQL 16+: a member of "
            "pg_create_subscription with CREATE on the database)",
        )
    leaks = quiet_secret_statements(conn)
    if leaks and has_password:
        raise PasswordExposureError("subscription", name, role, leaks)
