"""A psycopg session to a server that does not answer gives up within a bounded time, as the
ADBC session does (``tests.postgres.test_adbc``): with no connect_timeout of the user's,
psycopg waited 130 s per host, so a frozen source held a run (its stream's fallback peek, its
writer lock) for minutes."""

from __future__ import annotations

import time

import pytest

from airflow_pglogrepl.exceptions import ConnectionFailedError
from airflow_pglogrepl.postgres import connect
from tests.support.pg_proxy import error_within, frozen_endpoint

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("replication", [False, True])
def test_a_session_gives_up_on_a_frozen_server_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, replication: bool
) -> None:
    monkeypatch.setattr(connect, "CONNECT_TIMEOUT_S", 2)  # libpq's least
    for name in ("PGCONNECT_TIMEOUT", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    with frozen_endpoint() as port:
        params = {"host": "127.0.0.1", "port": str(port), "user": "u", "password": "Secr3t-pw",
                  "dbname": "d"}  # fmt: skip
        began = time.monotonic()
        error = error_within(
            lambda: connect.connect(params, label="SRC", replication=replication), 30
        )
        took = time.monotonic() - began
    assert isinstance(error, ConnectionFailedError) and error.retryable, error
    assert "timeout" in str(error) and "SRC" in str(error) and "Secr3t-pw" not in str(error)
    assert 1.5 < took < 10, took
