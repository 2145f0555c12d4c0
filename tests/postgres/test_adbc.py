"""ADBC sessions: the peek's arguments bound as one text-array literal, never spliced into
SQL; a connection made within a bounded time, a user's own bound kept."""

from __future__ import annotations

import time

import pytest

from tests.support.pg_proxy import error_within, frozen_endpoint

pytestmark = pytest.mark.unit


def test_peek_arguments_travel_as_a_text_array_literal_not_sql() -> None:
    from airflow_pglogrepl.postgres.adbc import text_array_literal

    assert text_array_literal(["publication_names", '"a ""b""", c\\d']) == (
        '{"publication_names","\\"a \\"\\"b\\"\\"\\", c\\\\d"}'
    )


# -- a server that does not answer ------------------------------------------------------------


def test_the_peek_gives_up_on_a_frozen_server_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a server that accepts the connection and never answers (e3: the postmaster
    stopped) held the ADBC peek in its connect for as long as it stayed frozen (libpq has no
    timeout of its own). Now the session is made within CONNECT_TIMEOUT_S (here libpq's least,
    2 s) when the user set none, and fails with the retryable ArrowPeekError (the drain then
    peeks through psycopg, which gives up as soon)."""
    from airflow_pglogrepl.exceptions import ArrowPeekError
    from airflow_pglogrepl.postgres import connect
    from airflow_pglogrepl.postgres.arrow_peek import peek_arrow

    monkeypatch.setattr(connect, "CONNECT_TIMEOUT_S", 2)
    for name in ("PGCONNECT_TIMEOUT", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    with frozen_endpoint() as port:
        params = {"host": "127.0.0.1", "port": str(port), "user": "u", "password": "Secr3t-pw",
                  "dbname": "d"}  # fmt: skip
        began = time.monotonic()
        error = error_within(
            lambda: list(peek_arrow(params, "s", label="L", upto_lsn="0/1", options={})), 30
        )
        took = time.monotonic() - began
    assert isinstance(error, ArrowPeekError) and error.retryable, error
    assert "timeout" in str(error) and "Secr3t-pw" not in str(error)
    assert 1.5 < took < 10, took


def test_a_users_own_connect_timeout_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is only a default: the parameter, PGCONNECT_TIMEOUT or a service (whose file
    may set one) win."""
    from airflow_pglogrepl.postgres.connect import CONNECT_TIMEOUT_S, bounded_connect

    for name in ("PGCONNECT_TIMEOUT", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    assert bounded_connect({"host": "h"}) == {"host": "h", "connect_timeout": "10"}
    assert CONNECT_TIMEOUT_S == 10
    assert bounded_connect({"connect_timeout": "0"}) == {"connect_timeout": "0"}  # theirs: 0
    assert bounded_connect({"service": "src"}) == {"service": "src"}
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "30")
    assert bounded_connect({"host": "h"}) == {"host": "h"}
