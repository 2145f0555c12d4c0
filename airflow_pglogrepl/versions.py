"""What each PostgreSQL major version has that the provider uses: decided in one place, by
``server_version_num``, never by catching an error.

Supported: 15 to 18. Each property names the version that brought the feature and what the
provider does with it; callers ask ``Features.of(conn.info.server_version)`` (or a
``ServerFacts.version_num``) instead of comparing numbers themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OLDEST_SUPPORTED", "Features"]

OLDEST_SUPPORTED = 150000


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
