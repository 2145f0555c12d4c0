"""``long_work_settings``: a long job turns off only the timeouts the server has."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.postgres.connect import long_work_settings

pytestmark = pytest.mark.unit


def test_long_work_turns_off_only_the_timeouts_the_server_has() -> None:
    assert "transaction_timeout" not in long_work_settings(160000)
    assert long_work_settings(170000)["transaction_timeout"] == "0"
    assert long_work_settings(150000)["idle_session_timeout"] == "0"
    assert long_work_settings(150000, lock_timeout_ms=500)["lock_timeout"] == "500"
