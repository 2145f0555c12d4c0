"""The subscription statements on a live server, on a subscription of hostile name created
without connecting (no worker, no slot): read back as the catalog has it, its connection changed
and compared, its publications and options set, its slot detached, its status, and dropped."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql
from psycopg.rows import dict_row

from airflow_pglogrepl.postgres import subscriptions
from airflow_pglogrepl.postgres.connect import run_ddl
from airflow_pglogrepl.postgres.lsn_adapters import register_lsn_adapters
from airflow_pglogrepl.testing.pgcluster import PgCluster

pytestmark = pytest.mark.pgversion  # pg_subscription gains columns with each major
_dbs = itertools.count(1)
NAME = 'Sub "x"; y'
PUBS = ['pub "a"', "pub;b"]
DETACHED = {"connect": False, "enabled": False, "create_slot": False, "slot_name": None}


@pytest.fixture
def conn(subscriber: PgCluster) -> Iterator[Any]:
    db = f"pg_subs_{next(_dbs)}"
    subscriber.create_database(db)
    with subscriber.connect(db, row_factory=dict_row) as c:
        register_lsn_adapters(c)
        yield c


def publisher_params(publisher: PgCluster, password: str) -> dict[str, str]:
    return {"host": publisher.host, "port": str(publisher.port), "dbname": "po'st gres",
            "user": "postgres", "password": password}  # fmt: skip


def test_created_read_back_changed_and_dropped(conn: Any, publisher: PgCluster) -> None:
    from airflow_pglogrepl import conninfo

    assert subscriptions.read_subscription(conn, NAME) is None
    params = publisher_params(publisher, "s3cr'et")
    options = {**DETACHED, "binary": True, "synchronous_commit": "off"}
    run_ddl(conn, subscriptions.create_statement(NAME, conninfo.make_dsn(params), PUBS, options))

    found = subscriptions.read_subscription(conn, NAME)
    assert found is not None
    assert (found.name, found.enabled, found.slot_name, found.publications) == (
        NAME, False, None, tuple(PUBS)
    )  # fmt: skip
    assert found.binary and found.synchronous_commit == "off"
    assert found.target == {k: params[k] for k in subscriptions.TARGET_KEYS}  # no password
    assert subscriptions.stored_conninfo(conn, NAME) == params

    moved = publisher_params(publisher, "n3w")
    run_ddl(conn, subscriptions.connection_statement(NAME, moved))
    assert subscriptions.stored_conninfo(conn, NAME) == moved
    run_ddl(conn, subscriptions.set_publications_statement(
        NAME, ["only"], refresh=False, copy_data=True))  # fmt: skip
    run_ddl(conn, subscriptions.set_options_statement(NAME, {"binary": False}))
    found = subscriptions.read_subscription(conn, NAME)
    assert found is not None and found.publications == ("only",) and not found.binary

    run_ddl(conn, subscriptions.detach_slot_statement(NAME))
    run_ddl(conn, subscriptions.drop_statement(NAME))
    assert subscriptions.read_subscription(conn, NAME) is None


def test_status_of_a_subscription_that_never_connected(conn: Any, publisher: PgCluster) -> None:
    from airflow_pglogrepl import conninfo

    assert not subscriptions.subscription_status(conn, NAME).exists
    dsn = conninfo.make_dsn(publisher_params(publisher, "pw"))
    run_ddl(conn, subscriptions.create_statement(NAME, dsn, PUBS, DETACHED))
    try:
        status = subscriptions.subscription_status(conn, NAME)
        assert status.exists and status.enabled is False and status.relations == ()
        assert status.workers == 0 and not status.apply_worker
        assert subscriptions.sync_slot_names(conn, NAME) == ()
        assert subscriptions.role_may_create(conn)[1] is True  # the cluster's superuser
    finally:
        run_ddl(conn, subscriptions.drop_statement(NAME))


def test_alter_actions_compose_as_one_statement(conn: Any) -> None:
    statement = subscriptions.alter_statement(NAME, subscriptions.refresh_action(False))
    assert statement.as_string(conn) == (
        'ALTER SUBSCRIPTION "Sub ""x""; y" REFRESH PUBLICATION WITH (copy_data = false)'
    )
    disable = subscriptions.alter_statement(NAME, sql.SQL("DISABLE")).as_string(conn)
    assert disable == 'ALTER SUBSCRIPTION "Sub ""x""; y" DISABLE'
