"""Apply errors on the subscriber and the transaction they are stuck on, from the publisher
(the statements: ``postgres/conflicts.py``).

The error text is only in the subscriber's server log; over SQL there are counters
(``pg_stat_subscription_stats``), the workers, the origin's progress and a pending ``SKIP``. The
publisher's slot holds the stuck transaction itself: peeked, never consumed.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_pglogrepl.hooks.slots import SlotsMixin
from airflow_pglogrepl.hooks.subscriptions import SubscriptionsMixin
from airflow_pglogrepl.identifiers import publication_names_option
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import SubscriptionErrors
from airflow_pglogrepl.pgoutput.pending import PendingTransaction, first_pending_transaction
from airflow_pglogrepl.postgres import conflicts
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features

__all__ = ["ConflictsMixin", "SubscriptionErrors"]


class ConflictsMixin(SubscriptionsMixin, SlotsMixin):
    """Apply errors, the pending transaction, and ``SKIP`` (needs a subscription and a slot)."""

    # -- apply errors (subscriber) ----------------------------------------------------------

    def subscription_errors(self, name: str) -> SubscriptionErrors:
        """Error counters, workers, origin progress and tables not ready of a subscription."""
        status = self.subscription_status(name)
        if not status.exists:
            return SubscriptionErrors(name=name, exists=False)
        with self.session() as conn:
            head = conflicts.error_head(conn, name)
            if head is None:  # dropped between the two reads
                return SubscriptionErrors(name=name, exists=False)
            counts = conflicts.conflict_counts(conn, head["oid"])
            origin = conflicts.origin_progress(conn, head["oid"])
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
            conflicts=counts,
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
            if Features.of(conn.info.server_version).subscription_skip:
                conflicts.skip(conn, name, lsn)
                self.log.info("ALTER SUBSCRIPTION %s SKIP (lsn = %s) done", name, lsn)
                return "skip"
            if info.enabled:
                conflicts.set_enabled(conn, name, False)
            try:
                conflicts.advance_origin(conn, name, lsn)
            finally:
                if info.enabled:
                    conflicts.set_enabled(conn, name, True)
        self.log.info("Replication origin of subscription %s advanced to %s", name, lsn)
        return "origin"

    def clear_skip(self, name: str) -> None:
        """``ALTER SUBSCRIPTION ... SKIP (lsn = NONE)``: withdraw a pending skip (PG 15+)."""
        with self.session() as conn:
            self._require(conn, name)
            conflicts.skip(conn, name, None)

    def reset_subscription_error_stats(self, name: str) -> None:
        """``pg_stat_reset_subscription_stats``: apply and sync error counters back to zero."""
        with self.session() as conn:
            conflicts.reset_error_stats(conn, name)
