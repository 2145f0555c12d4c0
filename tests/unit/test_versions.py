"""``versions.Features``: each version-dependent decision, by ``server_version_num``."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.hooks.pg.connect import long_work_settings
from airflow_pglogrepl.versions import Features

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("version", "origins", "inactive_since", "non_superuser"),
    [
        (150010, "max_replication_slots", False, False),
        (160006, "max_replication_slots", False, True),
        (170006, "max_replication_slots", True, True),
        (180001, "max_active_replication_origins", True, True),
    ],
)
def test_features_by_version(
    version: int, origins: str, inactive_since: bool, non_superuser: bool
) -> None:
    features = Features.of(version)
    assert features.major == version // 10000
    assert features.origins_setting == origins
    assert features.slot_inactive_since is inactive_since
    assert features.non_superuser_subscriptions is non_superuser


def test_long_work_turns_off_only_the_timeouts_the_server_has() -> None:
    assert "transaction_timeout" not in long_work_settings(160000)
    assert long_work_settings(170000)["transaction_timeout"] == "0"
    assert long_work_settings(150000)["idle_session_timeout"] == "0"
    assert long_work_settings(150000, lock_timeout_ms=500)["lock_timeout"] == "500"
