"""The hook family's sessions, through the public hook of an Airflow connection: the libpq
parameters the connection gives (its extras, another database, an IAM token), sessions that
read ``pg_lsn`` as ``LSN`` in every mode, the server's notices logged with the secrets masked,
a failed login that names the connection and never the password, a trigger's session that gives
up on a frozen server, and a caller's session used as it is (what it has not committed is seen)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import quote

import pytest

from airflow_pglogrepl.exceptions import ConnectionFailedError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres import connect
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import set_airflow_connection
from tests.support.databases import Database
from tests.support.pg_proxy import error_within, frozen_endpoint

WRONG = "wr'ong;pw"


def test_the_connection_s_fields_and_libpq_extras_are_the_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_BASE_PARAMS",
        "postgres://al%20ice:p%40ss@db.example:5433/app?sslmode=require&cursor=dictcursor"
        "&connect_timeout=7",
    )
    params = PgLogicalReplicationHook(postgres_conn_id="base_params").connection_params()
    # cursor is an extra of the postgres provider, not a libpq keyword: dropped
    assert params == {
        "host": "db.example",
        "port": "5433",
        "user": "al ice",
        "password": "p@ss",
        "dbname": "app",
        "sslmode": "require",
        "connect_timeout": "7",
        "application_name": "airflow-pglogrepl",
    }
    other = PgLogicalReplicationHook(postgres_conn_id="base_params", database="other")
    assert other.connection_params()["dbname"] == "other"
    assert asyncio.run(other.aconnection_params()) == {**params, "dbname": "other"}


def test_an_iam_connection_logs_in_with_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_BASE_IAM", "postgres://stored:unused@db.example:5432/app?iam=true"
    )
    hook = PgLogicalReplicationHook(postgres_conn_id="base_iam")
    monkeypatch.setattr(hook, "get_iam_token", lambda conn: ("iam_user", "t0ken", 5439))
    params = hook.connection_params()
    assert (params["user"], params["password"], params["port"]) == ("iam_user", "t0ken", "5439")
    assert "iam" not in params


def test_sessions_read_lsns_in_every_mode(hook: PgLogicalReplicationHook) -> None:
    with hook.session() as conn:
        assert conn.autocommit
        row = conn.execute("SELECT pg_current_wal_lsn() AS at").fetchone()
        assert row is not None and isinstance(row["at"], LSN)
        name = conn.execute("SELECT current_setting('application_name') AS a").fetchone()
        assert name == {"a": "airflow-pglogrepl"}
    with hook.session(autocommit=False, application_name="base test") as conn:
        assert not conn.autocommit
        name = conn.execute("SELECT current_setting('application_name') AS a").fetchone()
        assert name == {"a": "base test"}
    with hook.session(replication=True) as conn:  # the replication protocol's commands
        row = conn.execute("IDENTIFY_SYSTEM").fetchone()
        assert row is not None and row["dbname"] == "postgres"
        assert LSN(row["xlogpos"]) > LSN("0/0")  # the protocol sends it as text

    async def read() -> Any:
        async with hook.asession() as aconn:
            assert aconn.autocommit
            cursor = await aconn.execute("SELECT pg_current_wal_lsn() AS at")
            return await cursor.fetchone()

    row = asyncio.run(read())
    assert row is not None and isinstance(row["at"], LSN)


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "airflow_pglogrepl.server"]


def test_notices_are_logged_with_the_secrets_masked(
    hook: PgLogicalReplicationHook, caplog: pytest.LogCaptureFixture
) -> None:
    password = hook.connection_params()["password"]
    caplog.set_level(logging.INFO)
    with hook.session(secrets=["other-s3cret"]) as conn:
        conn.execute("SELECT set_config('pglogrepl.say', %s, false)", (f"{password} other-s3cret",))
        conn.execute("DO $$ BEGIN RAISE NOTICE 'said: %', current_setting('pglogrepl.say'); END $$")
    said = _said(caplog)
    assert any("said: *** ***" in m for m in said), said
    assert not [m for m in said if password in m or "other-s3cret" in m]


def test_async_notices_are_logged_with_the_password_masked(
    hook: PgLogicalReplicationHook, caplog: pytest.LogCaptureFixture
) -> None:
    password = hook.connection_params()["password"]
    caplog.set_level(logging.INFO)

    async def notice() -> None:
        async with hook.asession() as aconn:
            await aconn.execute("SELECT set_config('pglogrepl.say', %s, false)", (password,))
            await aconn.execute(
                "DO $$ BEGIN RAISE WARNING 'async said: %', current_setting('pglogrepl.say');"
                " END $$"
            )

    asyncio.run(notice())
    said = _said(caplog)
    assert any("WARNING: async said: ***" in m for m in said), said
    assert not [m for m in said if password in m]


def test_a_failed_login_names_the_connection_and_never_the_password(publisher: PgCluster) -> None:
    set_airflow_connection(
        "base_wrong_password",
        f"postgres://{quote(publisher.superuser)}:{quote(WRONG, safe='')}"
        f"@{publisher.host}:{publisher.port}/postgres",
    )
    hook = PgLogicalReplicationHook(postgres_conn_id="base_wrong_password")
    where = f"{publisher.host}:{publisher.port}/postgres (Airflow connection 'base_wrong_password')"
    with pytest.raises(ConnectionFailedError, match="cannot connect") as caught:
        hook.session().__enter__()
    assert where in str(caught.value) and caught.value.retryable

    async def open_async() -> None:
        async with hook.asession():
            pass

    with pytest.raises(ConnectionFailedError) as async_caught:
        asyncio.run(open_async())
    assert where in str(async_caught.value)
    for error in (caught.value, async_caught.value):
        assert WRONG not in str(error) and "wr'ong" not in str(error)


def test_a_caller_s_session_is_used_as_it_is(database: Database) -> None:
    hook = database.hook
    with hook.session(autocommit=False) as conn:
        conn.execute('CREATE PUBLICATION "not yet" FOR ALL TABLES')
        assert hook.get_publication("not yet", conn=conn) is not None  # its own transaction
        assert hook.get_publication("not yet") is None  # a session of its own: not committed
        conn.rollback()


def test_a_trigger_s_session_gives_up_on_a_frozen_server_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deferred sensor's trigger polls through ``asession``: without a bound, a server that
    accepts and never answers held the triggerer's poll for psycopg's 130 s per host."""
    monkeypatch.setattr(connect, "CONNECT_TIMEOUT_S", 2)  # libpq's least
    for name in ("PGCONNECT_TIMEOUT", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    with frozen_endpoint() as port:
        set_airflow_connection("base_frozen", f"postgres://u:Secr3t-pw@127.0.0.1:{port}/d")
        hook = PgLogicalReplicationHook(postgres_conn_id="base_frozen")

        async def open_async() -> None:
            async with hook.asession():
                pass

        began = time.monotonic()
        error = error_within(lambda: asyncio.run(open_async()), 30)
        took = time.monotonic() - began
    assert isinstance(error, ConnectionFailedError) and error.retryable, error
    assert "base_frozen" in str(error) and "Secr3t-pw" not in str(error)
    assert 1.5 < took < 10, took
