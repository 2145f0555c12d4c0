"""Subscriptions on the subscriber: create, reconcile, alter, drop, and read their progress.

The ``CONNECTION`` clause carries the publisher's password. It is sent as an ``sql.Literal`` in a
session that first turns off every setting that would keep the statement's text in the
subscriber's log or statistics (``secret_statements``), and is not sent at all when one of them
cannot be turned off; our own logs and errors never contain it (errors are redacted). See
https://www.postgresql.org/docs/15/sql-createsubscription.html
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import (
    DefinitionConflictError,
    PasswordExposureError,
    PrivilegeError,
    PublisherNotConfiguredError,
    SubscriptionStatementError,
)
from airflow_pglogrepl.hooks.base import Conn, PgSessionHook, run_ddl
from airflow_pglogrepl.hooks.errors import WAL_LEVEL_REFUSAL
from airflow_pglogrepl.hooks.pg.secret_statements import quiet_secret_statements
from airflow_pglogrepl.models.records import (
    Reconciled,
    Record,
    RelState,
    SubscriptionInfo,
    SubscriptionStatus,
)
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
            newer = (
                _OPTIONS_16
                if Features.of(c.info.server_version).subscription_origin
                else _OPTIONS_15
            )
            row = c.execute(_INFO.format(newer=newer, this_db=_THIS_DB), (name,)).fetchone()
            stored = _stored_conninfo(c, name) if row is not None else None
        if row is None:
            return None
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
        with self.session(secrets=secrets) as conn, _redacted(secrets, publisher_params):
            _require_version(name, options, conn.info.server_version)
            _keep_password_home(conn, name, bool(secrets))
            current = self.get_subscription(name, conn=conn)
            if current is None:
                run_ddl(conn, _create_statement(name, dsn, publications, options))
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
        stored = _stored_conninfo(conn, name)
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
            run_ddl(conn, _connection_statement(name, publisher_params))
            details.append("connection options updated (values not shown)")
        if sorted(current.publications) != sorted(publications):
            refresh = current.enabled
            run_ddl(
                conn,
                sql.SQL("ALTER SUBSCRIPTION {} SET PUBLICATION {} WITH (refresh = {}{})").format(
                    sql.Identifier(name),
                    sql.SQL(", ").join(sql.Identifier(p) for p in publications),
                    sql.Literal(refresh),
                    sql.SQL(", copy_data = {}").format(
                        sql.Literal(bool(options.get("copy_data", True)))
                    )
                    if refresh
                    else sql.SQL(""),
                ),
            )
            details.append(f"publications {list(current.publications)} -> {list(publications)}")
        settable = {k: v for k, v in options.items() if k in SETTABLE_OPTIONS}
        changed = {k: v for k, v in settable.items() if _differs(current, k, v)}
        if changed:
            run_ddl(
                conn,
                sql.SQL("ALTER SUBSCRIPTION {} SET ({})").format(
                    sql.Identifier(name), _option_list(changed)
                ),
            )
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
        self._alter(
            name,
            sql.SQL("REFRESH PUBLICATION WITH (copy_data = {})").format(sql.Literal(copy_data)),
        )

    def _alter(self, name: str, action: sql.Composable) -> None:
        with self.session() as conn:
            self._require(conn, name)
            run_ddl(conn, sql.SQL("ALTER SUBSCRIPTION {} {}").format(sql.Identifier(name), action))
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
            drop = sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(name))
            try:
                run_ddl(conn, drop)
            except pgerr.Error as exc:
                if info.slot_name is None or not _publisher_unreachable(exc):
                    raise
                reason = str(exc).strip().splitlines()[0]
                self.log.warning(
                    "Publisher unreachable while dropping subscription %s (%s); detaching its "
                    "slot %s and dropping the subscription without it",
                    name,
                    reason,
                    info.slot_name,
                )
                ident = sql.Identifier(name)
                sync_slots = _sync_slot_names(conn, name)
                if info.enabled:
                    run_ddl(conn, sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
                run_ddl(conn, sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
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
            errors = (
                _ERRORS_15
                if Features.of(conn.info.server_version).subscription_skip
                else _ERRORS_OLD
            )
            head = conn.execute(_STATUS.format(errors=errors, this_db=_THIS_DB), (name,)).fetchone()
            rels = conn.execute(_RELS, (name,)).fetchall() if head else []
        return _status(name, head, rels)

    async def asubscription_status(self, name: str) -> SubscriptionStatus:
        """``subscription_status`` for triggers (non-blocking)."""
        async with self.asession() as conn:
            errors = (
                _ERRORS_15
                if Features.of(conn.info.server_version).subscription_skip
                else _ERRORS_OLD
            )
            cur = await conn.execute(_STATUS.format(errors=errors, this_db=_THIS_DB), (name,))
            head = await cur.fetchone()
            rels = await (await conn.execute(_RELS, (name,))).fetchall() if head else []
        return _status(name, head, rels)


def _status(
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


def _target(target: Mapping[str, str]) -> str:
    return (
        f"{target.get('user', '?')}@{target.get('host', 'localhost')}:"
        f"{target.get('port', '5432')}/{target.get('dbname', '?')}"
    )


def _option_value(value: Any) -> sql.Composable:
    if value is None:
        return sql.SQL("NONE")  # slot_name = NONE detaches the slot
    return sql.Literal(value)


def _option_list(options: Mapping[str, Any]) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(key), _option_value(value))
        for key, value in options.items()
    )


def _create_statement(
    name: str, dsn: str, publications: Sequence[str], options: Mapping[str, Any]
) -> sql.Composed:
    statement = sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {}").format(
        sql.Identifier(name),
        sql.Literal(dsn),
        sql.SQL(", ").join(sql.Identifier(p) for p in publications),
    )
    if options:
        statement = statement + sql.SQL(" WITH ({})").format(_option_list(options))
    return statement


def _sync_slot_names(conn: Conn, name: str) -> tuple[str, ...]:
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


def _errors_columns(server_version: int) -> sql.SQL:
    """The error counters' columns: from ``pg_stat_subscription_stats`` where it exists."""
    return _ERRORS_15 if Features.of(server_version).subscription_skip else _ERRORS_OLD


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
    row = conn.execute(
        "SELECT current_user AS role, current_setting('is_superuser') = 'on' AS superuser"
    ).fetchone()
    assert row is not None
    if (
        not row["superuser"]
        and not Features.of(conn.info.server_version).non_superuser_subscriptions
    ):
        raise PrivilegeError(
            row["role"],
            f"create or alter subscription {name!r}: before PostgreSQL 16 that needs a superuser",
            "connect to the subscriber as a superuser (PostgreSQL 16+: a member of "
            "pg_create_subscription with CREATE on the database)",
        )
    leaks = quiet_secret_statements(conn)
    if leaks and has_password:
        raise PasswordExposureError("subscription", name, row["role"], leaks)


def _stored_conninfo(conn: Conn, name: str) -> dict[str, Any] | None:
    """The subscription's stored connection parameters, or None when this role may not read
    them (or the subscription is gone)."""
    readable = conn.execute(_CONNINFO_READABLE).fetchone()
    if readable is None or not readable["ok"]:
        return None
    row = conn.execute(_CONNINFO, (name,)).fetchone()
    return None if row is None else dict(conninfo_to_dict(row["subconninfo"]))


def _connection_statement(name: str, publisher_params: Mapping[str, str]) -> sql.Composed:
    return sql.SQL("ALTER SUBSCRIPTION {} CONNECTION {}").format(
        sql.Identifier(name), sql.Literal(conninfo.make_dsn(publisher_params))
    )


def _publisher_unreachable(exc: Exception) -> bool:
    text = str(exc)
    return isinstance(exc, pgerr.ConnectionFailure | pgerr.ConnectionException) or (
        "could not connect to publisher" in text
    )


@contextmanager
def _redacted(
    secrets: Sequence[str], publisher_params: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Re-raise psycopg errors with every secret removed from the message; a publisher that
    refused for want of a setting raises ``PublisherNotConfiguredError`` (the redacted
    ``SubscriptionStatementError`` its cause)."""
    try:
        yield
    except psycopg.Error as exc:
        text = conninfo.redact(str(exc).strip(), secrets)
        error = SubscriptionStatementError(f"subscription statement failed: {text}")
        # the publisher restarting or out of senders, a lock or a lost session: these pass
        error.retryable = _publisher_unreachable(exc) or isinstance(
            exc, psycopg.OperationalError | pgerr.LockNotAvailable
        )
        refused = _publisher_refusal(text, publisher_params or {})
        if refused is not None:
            raise refused from error
        raise error from None


_SLOT_REFUSED = re.compile(r'could not create replication slot "([^"]*)"')
# PostgreSQL 17 quotes the setting's name
_SENDERS = re.compile(r'exceeds "?max_wal_senders"? \(currently (\d+)\)')
_QUOTED_SETTING = re.compile(r'"(wal_level|logical|max_wal_senders|max_replication_slots)"')
_NO_SLOTS = re.compile(r'max_replication_slots"? > 0')
# PostgreSQL 16+ decodes on a standby only when its primary has wal_level = logical
_ON_PRIMARY = re.compile(WAL_LEVEL_REFUSAL.pattern + r'"?\s+on the primary')


def _publisher_refusal(
    text: str, publisher_params: Mapping[str, str]
) -> PublisherNotConfiguredError | None:
    """The setting the publisher lacks, when its error (relayed by the subscriber) says so in
    the server's own sentence: names (a slot's, a database's) are quoted out first, so that a
    slot named "all_replication_slots_..." is taken for nothing."""
    host = publisher_params.get("host", "localhost")
    where = f"{host}:{publisher_params.get('port', '5432')}"
    publisher = (
        f"PostgreSQL {conninfo.describe(publisher_params)}" if publisher_params else "server"
    )
    slot = _SLOT_REFUSED.search(text)
    refused = f"to create replication slot {slot.group(1)!r}" if slot else "the subscription"
    # 17 quotes the settings as it quotes names: unquote those, then empty every quoted name
    said = re.sub(r'"[^"]*"', '""', _QUOTED_SETTING.sub(r"\1", text))
    if _ON_PRIMARY.search(said):
        return PublisherNotConfiguredError(
            "wal_level", "logical", publisher, refused,
            f"the publisher {where} is a standby, which decodes only when its primary logs "
            f"enough: set wal_level = logical on the primary of the publisher {where} (a "
            f"standby) (ALTER SYSTEM SET wal_level = 'logical', or in its postgresql.conf) and "
            f"restart the primary; until then every run fails alike. Nothing was created on the "
            f"subscriber",
        )  # fmt: skip
    if WAL_LEVEL_REFUSAL.search(said):
        return PublisherNotConfiguredError(
            "wal_level", "logical", publisher, refused,
            f"set wal_level = logical on the publisher {where} (ALTER SYSTEM SET wal_level = "
            f"'logical', or in its postgresql.conf) and restart it: wal_level only changes on "
            f"restart, and until then every run fails alike. Nothing was created on the "
            f"subscriber",
        )  # fmt: skip
    if _NO_SLOTS.search(said):
        return PublisherNotConfiguredError(
            "max_replication_slots", "above 0", publisher, refused,
            f"raise max_replication_slots on the publisher {where} (it is 0: no slot can be "
            f"created) and restart it; until then every run fails alike. Nothing was created "
            f"on the subscriber",
        )  # fmt: skip
    if "all replication slots are in use" in said:
        # often passing: table-sync slots hold places only while their tables copy
        return PublisherNotConfiguredError(
            "max_replication_slots", "larger than the number of slots in use", publisher,
            refused,
            f"drop abandoned slots on the publisher {where} (pg_replication_slots where active "
            f"is false) or raise max_replication_slots there and restart it. Nothing was "
            f"created on the subscriber",
            retryable=True,
        )  # fmt: skip
    senders = _SENDERS.search(said)
    if senders:
        none = senders.group(1) == "0"
        return PublisherNotConfiguredError(
            "max_wal_senders", "above the replication connections in use", publisher,
            "a replication connection", (
                f"raise max_wal_senders on the publisher {where} (it is 0: no replication "
                f"connection is allowed) and restart it"
                if none
                else f"end unused replication connections on the publisher {where} "
                f"(pg_stat_replication) or raise max_wal_senders there and restart it"
            ) + ". Nothing was created on the subscriber",
            retryable=not none,
        )  # fmt: skip
    return None
