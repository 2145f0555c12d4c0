"""What each PostgreSQL major version has that the provider uses: decided in one place, by
``server_version_num``, never by catching an error.

Supported: 15 to 18. Each property names the version that brought the feature and what the
provider does with it; callers ask ``Features.of(conn.info.server_version)`` (or a
``ServerFacts.version_num``) instead of comparing numbers themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OLDEST_SUPPORTED", "SUPPORTED_MAJORS", "Features"]

# The majors the test suite runs on (make test: the whole suite on the first, the tests marked
# ``pgversion`` on the others); README, docs/versions.md and the provider metadata say the same.
SUPPORTED_MAJORS = (15, 16, 17, 18)
OLDEST_SUPPORTED = SUPPORTED_MAJORS[0] * 10000


@dataclass(frozen=True)
class Features:
    """The features of one server version (``server_version_num``, e.g. 170006)."""

    version_num: int

    @classmethod
    def of(cls, version_num: int) -> Features:
        return cls(int(version_num))

    @property
    def major(self) -> int:
        return self.version_num // 10000

    @property
    def idle_session_timeout(self) -> bool:
        """14+: the setting exists (long sessions turn it off)."""
        return self.version_num >= 140000

    @property
    def transaction_timeout(self) -> bool:
        """17+: the setting exists (long sessions turn it off)."""
        return self.version_num >= 170000

    @property
    def slot_inactive_since(self) -> bool:
        """17+: ``pg_replication_slots.inactive_since``, the server's own inactivity clock."""
        return self.version_num >= 170000

    @property
    def origins_setting(self) -> str:
        """What caps a subscriber's replication origins (one per subscription and per table
        sync worker): ``max_replication_slots`` up to 17, ``max_active_replication_origins``
        from 18."""
        return (
            "max_active_replication_origins"
            if self.version_num >= 180000
            else ("max_replication_slots")
        )

    @property
    def non_superuser_subscriptions(self) -> bool:
        """16+: members of ``pg_create_subscription`` may create subscriptions."""
        return self.version_num >= 160000

    @property
    def terminate_backend_timeout(self) -> bool:
        """14+: ``pg_terminate_backend(pid, timeout)`` waits for the backend to exit."""
        return self.version_num >= 140000

    @property
    def subscription_skip(self) -> bool:
        """15+: ``ALTER SUBSCRIPTION ... SKIP`` and ``pg_stat_subscription_stats``."""
        return self.version_num >= 150000

    @property
    def conflict_counters(self) -> bool:
        """18+: ``pg_stat_subscription_stats.confl_*``, conflicts the apply worker met (some it
        resolves silently: a change to a row the subscriber lacks is skipped)."""
        return self.version_num >= 180000

    @property
    def subscription_origin(self) -> bool:
        """16+: subscription options ``origin``, ``password_required``, ``run_as_owner`` and
        ``streaming = parallel``."""
        return self.version_num >= 160000

    @property
    def failover_slots(self) -> bool:
        """17+: subscription option ``failover`` (slots synchronized to standbys)."""
        return self.version_num >= 170000

    @property
    def emit_message_signature(self) -> str:
        """``pg_logical_emit_message``'s text variant as GRANT and REVOKE name it: 17 added a
        ``flush`` argument (defaulted, so calls stay the same; the signature does not)."""
        extra = ", boolean" if self.version_num >= 170000 else ""
        return f"pg_logical_emit_message(boolean, text, text{extra})"

    @property
    def missing_publication_skipped(self) -> bool:
        """18+: pgoutput skips a publication that does not exist (a WARNING) where older
        servers fail the decoding: the caller has to look for it itself."""
        return self.version_num >= 180000
