"""The first hour (issue 27): what a new user's first mistakes look like. A publisher left at
``wal_level = replica``: the server's warning on CREATE PUBLICATION reaches the task log, and the
subscription's refused slot fails the task at once, naming the server and the fix. A misspelt
publication: the drain and the snapshot refuse it before anything starts, with the ones there.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_pglogrepl.boundary import raised_error
from airflow_pglogrepl.exceptions import PublicationNotFoundError, PublisherNotConfiguredError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.operators.drain import SlotDrainOperator
from airflow_pglogrepl.operators.publication import CreatePublicationOperator
from airflow_pglogrepl.operators.snapshot import InitialSnapshotOperator
from airflow_pglogrepl.operators.subscription import CreateSubscriptionOperator
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import context, set_airflow_connection
from tests.support.sources import Source


@pytest.fixture
def replica_conn(replica_level_cluster: PgCluster) -> Iterator[str]:
    replica_level_cluster.execute("CREATE TABLE IF NOT EXISTS shop (id int PRIMARY KEY)")
    set_airflow_connection("first_hour_replica", replica_level_cluster.airflow_uri())
    yield "first_hour_replica"
    replica_level_cluster.execute("DROP PUBLICATION IF EXISTS shop_pub")


@pytest.mark.pgversion  # the server words its messages by version (17 quotes names)
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
    assert any(  # PostgreSQL 17 quotes "wal_level"
        "wal_level is insufficient to publish logical changes" in r.getMessage().replace('"', "")
        for r in warned
    ), [r.getMessage() for r in caplog.records]
    (said,) = [r for r in warned if "wal_level" in r.getMessage()]
    assert said.name == "airflow_pglogrepl.server"
    assert "WARNING" in said.getMessage() and "HINT" in said.getMessage()
    # the hook's own warning (Airflow's task logger, printed) names the server and the fix
    (ours,) = [line for line in capsys.readouterr().out.splitlines() if "nothing yet" in line]
    assert "[warning" in ours and "wal_level is 'replica'" in ours
    assert f"PostgreSQL postgres@{where}/postgres publishes nothing yet" in ours
    assert "Fix: set wal_level = logical" in ours and "restart PostgreSQL" in ours


@pytest.mark.pgversion  # the server words its messages by version (17 quotes names)
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
    error = raised_error(failure.value)
    assert isinstance(error, PublisherNotConfiguredError)
    assert error.retryable is False
    assert error.setting == "wal_level"
    where = f"{replica_level_cluster.host}:{replica_level_cluster.port}"
    message = str(error)
    assert f"Fix: set wal_level = logical on the publisher {where}" in message
    assert "restart" in message
    assert "refused to create replication slot 'shop_sub'" in message
    cause = str(error.__cause__).replace('"', "")  # PostgreSQL 17 quotes the names
    assert "logical decoding requires wal_level >= logical" in cause
    assert subscriber.execute(
        "SELECT count(*) FROM pg_subscription WHERE subname = 'shop_sub'"
    ) == [(0,)]


# -- a misspelt publication is refused before anything starts -----------------------------------


@pytest.fixture
def typo_source(source: Source) -> Iterator[tuple[Source, str]]:
    """A database with a slot and two publications, and an Airflow connection to it."""
    source.sql("CREATE TABLE shop (id int PRIMARY KEY); CREATE TABLE audit (id int PRIMARY KEY)")
    source.sql(
        "CREATE PUBLICATION shop_pub FOR TABLE shop; CREATE PUBLICATION audit FOR TABLE audit"
    )
    conn_id = f"first_hour_{source.db}"
    set_airflow_connection(conn_id, source.cluster.airflow_uri(source.db))
    yield source, conn_id


def _refused(operator: Any) -> PublicationNotFoundError:
    with pytest.raises(AirflowFailException) as failure:
        operator.execute({"ti": None})
    error = raised_error(failure.value)
    assert isinstance(error, PublicationNotFoundError), repr(error)
    assert error.retryable is False
    # once in what the task log prints of the failure
    printed = "".join(traceback.format_exception(failure.value))
    assert printed.count(str(error)) == 1, printed
    return error


def _slot_position(source: Source) -> list[Any]:
    return source.sql(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (source.slot,)
    )


@pytest.mark.pgversion  # the server words its messages by version (17 quotes names)
def test_the_drain_refuses_a_misspelt_publication_before_spark(
    typo_source: tuple[Source, str], tmp_path: Path
) -> None:
    """Before: the slot was checked, then spark-submit ran with the typo."""
    source, conn_id = typo_source
    before = _slot_position(source)
    error = _refused(
        SlotDrainOperator(
            task_id="drain", postgres_conn_id=conn_id, slot_name=source.slot,
            publications=["shop_pubb"], lake=str(tmp_path / "lake"), conn_id="no_such_spark",
        )
    )  # fmt: skip
    where = f"{source.cluster.host}:{source.cluster.port}/{source.db}"
    assert str(error) == (
        f"publication 'shop_pubb' does not exist on PostgreSQL postgres@{where}. The "
        f"publications there: 'audit', 'shop_pub'; did you mean 'shop_pub'? Fix: correct the "
        f"publication name, or create it there (CREATE PUBLICATION, or "
        f"CreatePublicationOperator). Nothing was started: spark-submit did not run and the "
        f"slot did not move"
    )
    assert "18" not in str(error).replace(where, "")
    assert error.existing == ["audit", "shop_pub"] and error.names == ["shop_pubb"]
    assert _slot_position(source) == before and not (tmp_path / "lake").exists()


@pytest.mark.pgversion  # the server words its messages by version (17 quotes names)
def test_the_snapshot_refuses_a_misspelt_publication_instead_of_nothing_to_do(
    typo_source: tuple[Source, str], tmp_path: Path
) -> None:
    """Before: with a lake that held the snapshot it said "nothing to do"; with none it went
    on to create the slot and copy."""
    source, conn_id = typo_source
    source.sql("SELECT pg_drop_replication_slot(%s)", (source.slot,))
    try:
        error = _refused(
            InitialSnapshotOperator(
                task_id="snapshot", postgres_conn_id=conn_id, slot_name=source.slot,
                publications=["shop_pub", "audits"], lake=str(tmp_path / "lake"),
                conn_id="no_such_spark", outlets=[],
            )
        )  # fmt: skip
    finally:
        created = _slot_position(source)
        source.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (source.slot,))
    assert "publication 'audits' does not exist on PostgreSQL" in str(error)
    assert "did you mean 'audit'?" in str(error)
    assert "Nothing was started: no slot was created or dropped" in str(error)
    assert created == [] and not (tmp_path / "lake").exists()


@pytest.mark.parametrize(("version", "says_18"), [(150000, False), (170000, False), (180000, True)])
def test_a_missing_publication_mentions_postgresql_18_only_on_18(
    version: int, says_18: bool
) -> None:
    error = PublicationNotFoundError(["p"], "s", server_version=version)
    assert ("PostgreSQL 18" in str(error)) is says_18
    assert "Nothing was committed and the slot did not move" in str(error)


@pytest.mark.pgversion  # the server words its messages by version (17 quotes names)
def test_a_subscription_to_a_misspelt_publication_is_refused_before_it_is_created(
    publisher: PgCluster, publisher_conn_id: str, subscriber: PgCluster, subscriber_conn_id: str
) -> None:
    """Before: the subscription was created (the server only warned, from 15 on, or said
    nothing) and its apply worker failed in a loop on the publisher's error."""
    publisher.execute("CREATE TABLE IF NOT EXISTS hour_orders (id int PRIMARY KEY)")
    publisher.execute("DROP PUBLICATION IF EXISTS hour_orders_pub")
    publisher.execute("CREATE PUBLICATION hour_orders_pub FOR TABLE hour_orders")
    try:
        error = _refused(
            CreateSubscriptionOperator(
                task_id="s", subscription="hour_sub", publications=["hour_order_pub"],
                publisher_conn_id=publisher_conn_id, subscriber_conn_id=subscriber_conn_id,
            )
        )  # fmt: skip
        assert str(error).startswith(
            f"publication 'hour_order_pub' does not exist on PostgreSQL postgres@"
            f"{publisher.host}:{publisher.port}/postgres. The publications there: "
        )
        assert "did you mean 'hour_orders_pub'?" in str(error)
        assert str(error).endswith("Nothing was created on the subscriber or the publisher")
        assert subscriber.execute("SELECT count(*) FROM pg_subscription") == [(0,)]
        assert publisher.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'hour_sub'"
        ) == [(0,)]
    finally:  # before: the subscription was made, and its slot with it
        PgLogicalReplicationHook(postgres_conn_id=subscriber_conn_id).drop_subscription("hour_sub")
        publisher.execute("DROP PUBLICATION hour_orders_pub")


@pytest.mark.parametrize("name", ["shop_" + "x" * 70, "é" * 40, 'Shop "Pub", ' + "ü" * 30])
def test_a_name_past_63_bytes_is_found_as_the_server_finds_it(
    typo_source: tuple[Source, str], name: str
) -> None:
    """The server cuts an identifier to 63 bytes (never inside a character), in CREATE
    PUBLICATION, CREATE SUBSCRIPTION and pgoutput's publication_names alike: the name the DAG
    gives in full names the publication it created. Before: "does not exist", "did you mean"
    the very same publication, where the drain and the subscription would have worked."""
    from psycopg import sql

    source, conn_id = typo_source
    source.cluster.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE shop").format(sql.Identifier(name)),
        dbname=source.db,
    )
    hook = PgLogicalReplicationHook(postgres_conn_id=conn_id)
    hook.require_publications([name, "shop_pub"], consequence="nothing")
    with pytest.raises(PublicationNotFoundError) as info:
        hook.require_publications([name + "-other", name[:10]], consequence="nothing")
    assert info.value.names == [name[:10]]


@pytest.mark.pgversion  # the server words its messages by version (17 quotes names)
def test_a_slot_named_after_wal_level_is_not_a_publisher_short_of_it(
    publisher: PgCluster, publisher_conn_id: str, subscriber: PgCluster, subscriber_conn_id: str
) -> None:
    """The publisher refuses the subscription's slot because it exists already: that is what
    the task says. Before: the slot's name ("logical_wal_level_sub") made it "set wal_level =
    logical on the publisher and restart it", on a publisher at wal_level = logical."""
    from airflow_pglogrepl.exceptions import SubscriptionStatementError

    publisher.execute("CREATE TABLE IF NOT EXISTS hour_orders (id int PRIMARY KEY)")
    subscriber.execute("CREATE TABLE IF NOT EXISTS hour_orders (id int PRIMARY KEY)")
    publisher.execute("DROP PUBLICATION IF EXISTS hour_wal_pub")
    publisher.execute("CREATE PUBLICATION hour_wal_pub FOR TABLE hour_orders")
    publisher.execute(
        "SELECT pg_create_logical_replication_slot('logical_wal_level_sub', 'pgoutput')"
    )
    try:
        with pytest.raises(SubscriptionStatementError) as info:
            CreateSubscriptionOperator(
                task_id="s", subscription="logical_wal_level_sub", publications=["hour_wal_pub"],
                publisher_conn_id=publisher_conn_id, subscriber_conn_id=subscriber_conn_id,
            ).execute(context())  # fmt: skip
        assert not isinstance(info.value, PublisherNotConfiguredError)
        assert "already exists" in str(info.value)
    finally:
        publisher.execute("SELECT pg_drop_replication_slot('logical_wal_level_sub')")
        publisher.execute("DROP PUBLICATION hour_wal_pub")


def test_a_database_of_many_publications_lists_a_few_of_them() -> None:
    """Before: every publication of the database was in the message (one per tenant: thousands,
    in every alert and task log line of the failure)."""
    existing = [f"tenant_{i:04}_pub" for i in range(5000)]
    error = PublicationNotFoundError(["tenant_0042_pubb"], existing=existing, consequence="x")
    assert len(str(error)) < 1000
    assert "'tenant_0000_pub', " in str(error) and "and 4980 more" in str(error)
    assert "did you mean 'tenant_0042_pub'?" in str(error)
    assert error.existing == existing


# -- a role short of a privilege is refused before anything starts ------------------------------


def _role_conn(source: Source, role: str, *attributes: str) -> str:
    """An Airflow connection to the source's database as a new role with ``attributes``."""
    from urllib.parse import quote

    from psycopg import sql

    cluster = source.cluster
    cluster.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    cluster.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' {}").format(
        sql.Identifier(role), sql.SQL(" ".join(attributes))))  # fmt: skip
    conn_id = f"first_hour_role_{role.lower().replace(' ', '_')}"
    set_airflow_connection(
        conn_id, f"postgres://{quote(role, safe='')}:pw@{cluster.host}:{cluster.port}/{source.db}"
    )
    return conn_id


def test_a_drain_as_a_role_without_replication_is_refused_before_spark(
    typo_source: tuple[Source, str], tmp_path: Path
) -> None:
    """Before: spark-submit ran and the application failed on its first peek."""
    from airflow_pglogrepl.exceptions import PrivilegeError

    source, _ = typo_source
    conn_id = _role_conn(source, "Lake Reader")
    with pytest.raises(AirflowFailException) as failure:
        SlotDrainOperator(
            task_id="drain", postgres_conn_id=conn_id, slot_name=source.slot,
            publications=["shop_pub"], lake=str(tmp_path / "lake"), conn_id="no_such_spark",
        ).execute({"ti": None})  # type: ignore[arg-type]  # fmt: skip
    error = raised_error(failure.value)
    assert isinstance(error, PrivilegeError) and not error.retryable
    assert str(error) == (
        "role 'Lake Reader' may not use replication slots (a drain peeks and advances its slot, "
        'a snapshot creates it). Nothing was done. Fix: as a superuser, ALTER ROLE "Lake Reader" '
        "REPLICATION"
    )
    assert not (tmp_path / "lake").exists()


def test_a_snapshot_as_a_role_that_cannot_read_a_table_is_refused_before_the_slot(
    typo_source: tuple[Source, str], tmp_path: Path
) -> None:
    from airflow_pglogrepl.exceptions import PrivilegeError

    source, _ = typo_source
    source.sql("SELECT pg_drop_replication_slot(%s)", (source.slot,))
    conn_id = _role_conn(source, "snap_rep", "REPLICATION")
    source.sql("GRANT SELECT ON shop TO snap_rep")
    try:
        with pytest.raises(AirflowFailException) as failure:
            InitialSnapshotOperator(
                task_id="snapshot", postgres_conn_id=conn_id, slot_name=source.slot,
                publications=["shop_pub", "audit"], lake=str(tmp_path / "lake"),
                conn_id="no_such_spark", outlets=[],
            ).execute({"ti": None})  # type: ignore[arg-type]  # fmt: skip
    finally:
        created = _slot_position(source)
        source.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (source.slot,))
    error = raised_error(failure.value)
    assert isinstance(error, PrivilegeError)
    copies = 'may not SELECT 1 published table(s) the snapshot copies: "public"."audit"'
    assert copies in str(error)
    assert 'Fix: GRANT SELECT ON "public"."audit" TO "snap_rep"' in str(error)
    assert created == [] and not (tmp_path / "lake").exists()
