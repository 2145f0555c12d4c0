"""The first hour (issue 27): what a new user's first mistakes look like. A publisher left at
``wal_level = replica``: the server's warning on CREATE PUBLICATION reaches the task log, and the
subscription's refused slot fails the task at once, naming the server and the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_pglogrepl.exceptions import PublisherNotConfiguredError
from airflow_pglogrepl.operators.publication import CreatePublicationOperator
from airflow_pglogrepl.operators.subscription import CreateSubscriptionOperator
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import context, set_airflow_connection


@pytest.fixture
def replica_conn(replica_level_cluster: PgCluster) -> Iterator[str]:
    replica_level_cluster.execute("CREATE TABLE IF NOT EXISTS shop (id int PRIMARY KEY)")
    set_airflow_connection("first_hour_replica", replica_level_cluster.airflow_uri())
    yield "first_hour_replica"
    replica_level_cluster.execute("DROP PUBLICATION IF EXISTS shop_pub")


def test_server_warning_on_create_publication_is_logged(
    replica_conn: str,
    replica_level_cluster: PgCluster,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: the server's WARNING was dropped; the log said only that it was created."""
    caplog.set_level(logging.INFO)
    where = f"{replica_level_cluster.host}:{replica_level_cluster.port}"
    CreatePublicationOperator(
        task_id="p", publication="shop_pub", postgres_conn_id=replica_conn, tables=["shop"]
    ).execute(context())
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "wal_level is insufficient to publish logical changes" in r.getMessage() for r in warned
    ), [r.getMessage() for r in caplog.records]
    (said,) = [r for r in warned if "wal_level" in r.getMessage()]
    assert said.name == "airflow_pglogrepl.server"
    assert "WARNING" in said.getMessage() and "HINT" in said.getMessage()
    # the hook's own warning (Airflow's task logger, printed) names the server and the fix
    (ours,) = [line for line in capsys.readouterr().out.splitlines() if "nothing yet" in line]
    assert "[warning" in ours and "wal_level is 'replica'" in ours
    assert f"PostgreSQL postgres@{where}/postgres publishes nothing yet" in ours
    assert "Fix: set wal_level = logical" in ours and "restart PostgreSQL" in ours


def test_subscription_to_a_replica_level_publisher_fails_at_once_with_the_fix(
    replica_conn: str, replica_level_cluster: PgCluster, subscriber: PgCluster
) -> None:
    """Before: a retryable SubscriptionStatementError with the server's text and no fix."""
    subscriber.execute("CREATE TABLE IF NOT EXISTS shop (id int PRIMARY KEY)")
    CreatePublicationOperator(
        task_id="p", publication="shop_pub", postgres_conn_id=replica_conn, tables=["shop"]
    ).execute(context())
    operator = CreateSubscriptionOperator(
        task_id="s", subscription="shop_sub", publications=["shop_pub"],
        publisher_conn_id=replica_conn, subscriber_conn_id="pglogrepl_subscriber",
    )  # fmt: skip
    set_airflow_connection("pglogrepl_subscriber", subscriber.airflow_uri())
    with pytest.raises(AirflowFailException) as failure:
        operator.execute(context())
    error = failure.value.__cause__
    assert isinstance(error, PublisherNotConfiguredError)
    assert error.retryable is False
    assert error.setting == "wal_level"
    where = f"{replica_level_cluster.host}:{replica_level_cluster.port}"
    message = str(error)
    assert f"Fix: set wal_level = logical on the publisher {where}" in message
    assert "restart" in message
    assert "refused to create replication slot 'shop_sub'" in message
    assert "logical decoding requires wal_level >= logical" in str(error.__cause__)
    assert subscriber.execute(
        "SELECT count(*) FROM pg_subscription WHERE subname = 'shop_sub'"
    ) == [(0,)]
