"""Apply errors on the subscriber and the transaction they are stuck on, from the publisher.

The error text is only in the subscriber's server log; over SQL there are counters
(``pg_stat_subscription_stats``), the workers, the origin's progress and a pending ``SKIP``. The
publisher's slot holds the stuck transaction itself: peeked, never consumed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.hooks.base import run_ddl
from airflow_pglogrepl.hooks.slots import SlotsMixin
from airflow_pglogrepl.hooks.subscriptions import SubscriptionsMixin
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import Record, RelState
from airflow_pglogrepl.names import publication_names_option
from airflow_pglogrepl.pgoutput.pending import PendingTransaction, first_pending_transaction
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features


@dataclass(frozen=True)
class SubscriptionErrors(Record):
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

    dict_names = {"name": "subscription"}


class ConflictsMixin(SubscriptionsMixin, SlotsMixin):
    """Apply errors, the pending transaction, and ``SKIP`` (needs a subscription and a slot)."""

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
