"""What the server says on our sessions (its WARNINGs and NOTICEs) reaches the task log, but
never the publisher's password: not when a lowered ``client_min_messages`` makes the server
echo every statement it parses, nor when a NOTICE (an event trigger's) quotes the statement."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from psycopg import sql

from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.testing.pgcluster import PgCluster

DB = "notice_sub"
QUOTED_PW = "it's-a\\secret"  # a quote and a backslash: escaped twice in CONNECTION '...'


@pytest.fixture
def notice_pair(
    publisher: PgCluster, subscriber: PgCluster
) -> Iterator[tuple[PgCluster, PgCluster]]:
    for cluster in (publisher, subscriber):
        cluster.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        cluster.create_database(DB)
        cluster.execute("CREATE TABLE t (id int PRIMARY KEY)", dbname=DB)
    publisher.execute("CREATE PUBLICATION notice_pub FOR TABLE t", dbname=DB)
    publisher.execute("DROP ROLE IF EXISTS notice_rep")
    publisher.execute(sql.SQL("CREATE ROLE notice_rep LOGIN REPLICATION PASSWORD {}").format(
        sql.Literal(QUOTED_PW)))  # fmt: skip
    publisher.execute("GRANT SELECT ON t TO notice_rep", dbname=DB)
    yield publisher, subscriber
    DsnReplicationHook(subscriber.dsn(DB)).drop_subscription("notice_sub")
    for cluster in (subscriber, publisher):
        cluster.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    publisher.execute("DROP ROLE notice_rep")


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "airflow_pglogrepl.server"]


def test_a_lowered_client_min_messages_does_not_put_the_password_in_the_log(
    notice_pair: tuple[PgCluster, PgCluster], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: every "DEBUG: parse <unnamed>: ..." was logged at INFO, CREATE SUBSCRIPTION's
    CONNECTION clause, password and all, among them."""
    publisher, subscriber = notice_pair
    # a DBA debugging the subscriber: the server then sends its DEBUG lines to every session
    subscriber.execute(f"ALTER DATABASE {DB} SET client_min_messages = debug2")
    caplog.set_level(logging.DEBUG)
    DsnReplicationHook(subscriber.dsn(DB)).ensure_subscription(
        "notice_sub", publisher_params=publisher.params(DB), publications=["notice_pub"],
        options={},
    )  # fmt: skip
    said = _said(caplog)
    assert [m for m in said if publisher.password in m] == []
    assert not [m for m in said if "DEBUG" in m or "CREATE SUBSCRIPTION" in m], said


def test_a_notice_quoting_the_statement_has_the_password_masked(
    notice_pair: tuple[PgCluster, PgCluster], caplog: pytest.LogCaptureFixture
) -> None:
    """An event trigger that echoes each DDL statement: the publisher's password (a quote and a
    backslash in it, so it is escaped twice in the statement) is masked."""
    publisher, subscriber = notice_pair
    subscriber.execute(
        "CREATE FUNCTION echo() RETURNS event_trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE NOTICE 'ran: %', current_query(); END $$; "
        "CREATE EVENT TRIGGER echo ON ddl_command_end EXECUTE FUNCTION echo()",
        dbname=DB,
    )
    caplog.set_level(logging.INFO)
    DsnReplicationHook(subscriber.dsn(DB)).ensure_subscription(
        "notice_sub",
        publisher_params={**publisher.params(DB), "user": "notice_rep", "password": QUOTED_PW},
        publications=["notice_pub"], options={},
    )  # fmt: skip
    (echoed,) = [m for m in _said(caplog) if "ran: CREATE SUBSCRIPTION" in m]
    assert "password=''***''" in echoed
    assert "secret" not in echoed and "it" not in echoed.split("password=")[1][:8]


def test_routine_notices_are_info_and_warnings_stay_warnings(
    notice_pair: tuple[PgCluster, PgCluster], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: every NOTICE was a WARNING, so each subscription created or dropped left a
    warning ("created replication slot ... on publisher") in a run that went well."""
    publisher, subscriber = notice_pair
    caplog.set_level(logging.INFO)
    hook = DsnReplicationHook(subscriber.dsn(DB))
    hook.ensure_subscription(
        "notice_sub", publisher_params=publisher.params(DB), publications=["notice_pub"],
        options={},
    )  # fmt: skip
    hook.drop_subscription("notice_sub")
    server = [r for r in caplog.records if r.name == "airflow_pglogrepl.server"]
    assert [r.levelno for r in server if "replication slot" in r.getMessage()] == [
        logging.INFO, logging.INFO,
    ], [r.getMessage() for r in server]  # fmt: skip
    assert [r for r in server if r.levelno >= logging.WARNING] == []
    caplog.clear()  # a WARNING stays one
    with hook.session() as conn:
        conn.execute("DO $$ BEGIN RAISE WARNING 'careful'; RAISE INFO 'fyi'; END $$")
    said = {r.getMessage().rsplit(": ", 1)[1]: r.levelno for r in caplog.records
            if r.name == "airflow_pglogrepl.server"}  # fmt: skip
    assert said == {"careful": logging.WARNING, "fyi": logging.INFO}
