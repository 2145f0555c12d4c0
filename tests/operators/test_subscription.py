"""Subscriptions: the slot name derived from a subscription's, and the life cycle's edges on
live clusters (alter actions, drop with an unreachable publisher).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.operators.publication import (
    CreatePublicationOperator,
    DropPublicationOperator,
)
from airflow_pglogrepl.operators.subscription import (
    AlterSubscriptionOperator,
    CreateSubscriptionOperator,
    DropSubscriptionOperator,
    slot_name_for,
)
from airflow_pglogrepl.testing.pgcluster import PgCluster, local_cluster
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.airflow import context, set_airflow_connection


@pytest.mark.parametrize(
    ("name", "valid_slot"),
    [("orders_sub", True), ('Sub ✓ "x"', False), ("UPPER", False), ("a" * 70, False)],
)
def test_slot_name_for(name: str, valid_slot: bool) -> None:
    slot = slot_name_for(name)
    assert (slot == name) is valid_slot
    assert len(slot) <= 63 and all(c.isdigit() or c == "_" or "a" <= c <= "z" for c in slot)
    assert slot_name_for(name) == slot  # stable across runs
    if not valid_slot:
        assert slot_name_for(name + "!") != slot


# The tests below depend on the server's major version: make test runs them on 15 to 18.


@pytest.fixture
def lonely_publisher() -> Iterator[PgCluster]:
    """A publisher of its own, so the test may stop it."""
    with local_cluster("lonely-publisher") as cluster:
        set_airflow_connection("lonely_pub", cluster.airflow_uri())
        yield cluster


def _subscribe(publisher_conn: str, subscriber: PgCluster, name: str) -> None:
    subscriber.execute("CREATE TABLE IF NOT EXISTS ops_t (id int PRIMARY KEY)")
    CreatePublicationOperator(
        task_id="p", publication="ops_pub", postgres_conn_id=publisher_conn, tables=["ops_t"]
    ).execute(context())
    CreateSubscriptionOperator(
        task_id="s", subscription=name, publications=["ops_pub"],
        publisher_conn_id=publisher_conn, subscriber_conn_id="pglogrepl_subscriber",
    ).execute(context())  # fmt: skip


def _subscribe_table(publisher_conn: str, name: str, table: str) -> None:
    CreatePublicationOperator(
        task_id="p", publication="ops_pub", postgres_conn_id=publisher_conn, tables=[table]
    ).execute(context())
    CreateSubscriptionOperator(
        task_id="s", subscription=name, publications=["ops_pub"],
        publisher_conn_id=publisher_conn, subscriber_conn_id="pglogrepl_subscriber",
    ).execute(context())  # fmt: skip


@pytest.mark.pgversion
def test_drop_with_unreachable_publisher_detaches_and_names_the_slot(
    lonely_publisher: PgCluster, subscriber: PgCluster, subscriber_conn_id: str
) -> None:
    lonely_publisher.execute(
        "CREATE TABLE ops_hold (id int PRIMARY KEY); INSERT INTO ops_hold VALUES (1)"
    )
    # The table's sync holds a slot of its own on the publisher until its copy is done: keep
    # the copy waiting (a trigger that fires in the sync worker too waits for an advisory lock
    # this test holds), so the publisher goes away with that slot.
    subscriber.execute(
        "CREATE TABLE IF NOT EXISTS ops_hold (id int PRIMARY KEY);"
        " CREATE OR REPLACE FUNCTION ops_hold_copy() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN PERFORM pg_advisory_lock(4242); PERFORM pg_advisory_unlock(4242);"
        " RETURN NEW; END$$;"
        " CREATE OR REPLACE TRIGGER hold BEFORE INSERT ON ops_hold FOR EACH ROW"
        " EXECUTE FUNCTION ops_hold_copy(); ALTER TABLE ops_hold ENABLE ALWAYS TRIGGER hold"
    )
    with subscriber.connect() as holder:
        holder.execute("SELECT pg_advisory_lock(4242)")
        _subscribe_table("lonely_pub", "ops_unreachable", "ops_hold")
        wait_until(lambda: lonely_publisher.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pg\\_%\\_sync\\_%'"
        ) == [(1,)], what="the table-sync slot")  # fmt: skip
        lonely_publisher.stop()
        holder.execute("SELECT pg_advisory_unlock(4242)")
    result = DropSubscriptionOperator(
        task_id="d", subscription="ops_unreachable", subscriber_conn_id=subscriber_conn_id
    ).execute(context())
    assert result["dropped"] is True
    assert result["slot_left_behind"] == "ops_unreachable"
    assert "could not connect" in (result["reason"] or "")
    hook = PgLogicalReplicationHook(postgres_conn_id=subscriber_conn_id)
    assert hook.get_subscription("ops_unreachable") is None
    lonely_publisher.start()
    slots = PgLogicalReplicationHook(postgres_conn_id="lonely_pub").list_slots()
    # every slot left on the publisher was named: the subscription's, and the table-sync slot
    # of the table whose copy had not finished (before: only the first)
    assert {s.name for s in slots} == {"ops_unreachable", *result["sync_slots_left_behind"]}
    (sync,) = result["sync_slots_left_behind"]
    assert re.fullmatch(r"pg_\d+_sync_\d+_\d+", sync)


@pytest.mark.pgversion
def test_drop_when_reachable_takes_the_slot_and_is_idempotent(
    publisher: PgCluster, publisher_conn_id: str, subscriber: PgCluster, subscriber_conn_id: str
) -> None:
    publisher.execute("CREATE TABLE IF NOT EXISTS ops_t (id int PRIMARY KEY)")
    _subscribe(publisher_conn_id, subscriber, "ops_reachable")
    pub_hook = PgLogicalReplicationHook(postgres_conn_id=publisher_conn_id)
    assert "ops_reachable" in [s.name for s in pub_hook.list_slots()]
    drop = DropSubscriptionOperator(
        task_id="d", subscription="ops_reachable", subscriber_conn_id=subscriber_conn_id
    )
    assert drop.execute(context())["slot_left_behind"] is None
    assert "ops_reachable" not in [s.name for s in pub_hook.list_slots()]
    assert drop.execute(context())["dropped"] is False
    assert DropPublicationOperator(
        task_id="x", publication="ops_pub", postgres_conn_id=publisher_conn_id
    ).execute(context()) == {"publication": "ops_pub", "dropped": True}


@pytest.mark.pgversion
def test_alter_actions(
    publisher: PgCluster, publisher_conn_id: str, subscriber: PgCluster, subscriber_conn_id: str
) -> None:
    publisher.execute("CREATE TABLE IF NOT EXISTS ops_t (id int PRIMARY KEY)")
    _subscribe(publisher_conn_id, subscriber, "ops_alter")
    hook = PgLogicalReplicationHook(postgres_conn_id=subscriber_conn_id)

    def alter(action: str) -> None:
        AlterSubscriptionOperator(
            task_id=action, subscription="ops_alter", subscriber_conn_id=subscriber_conn_id,
            action=action,  # type: ignore[arg-type]
        ).execute(context())  # fmt: skip

    alter("disable")
    info = hook.get_subscription("ops_alter")
    assert info is not None and info.enabled is False
    wait_until(lambda: hook.subscription_status("ops_alter").workers == 0, what="worker stopped")
    alter("enable")
    wait_until(lambda: hook.subscription_status("ops_alter").apply_worker, what="worker back")
    # refresh picks up a table added to the publication
    for cluster in (publisher, subscriber):
        cluster.execute("CREATE TABLE ops_added (id int PRIMARY KEY)")
    publisher.execute("INSERT INTO ops_added SELECT generate_series(1, 10)")
    CreatePublicationOperator(
        task_id="p", publication="ops_pub", postgres_conn_id=publisher_conn_id,
        tables=["ops_t", "ops_added"],
    ).execute(context())  # fmt: skip
    alter("refresh")
    wait_until(lambda: subscriber.execute("SELECT count(*) FROM ops_added") == [(10,)],
               what="ops_added copied")  # fmt: skip
    hook.drop_subscription("ops_alter")
    with pytest.raises(Exception, match="does not exist"):
        alter("enable")


def test_a_failover_subscription_needs_a_publisher_that_keeps_failover_slots(
    publisher: PgCluster, subscriber: PgCluster, publisher_conn_id: str, subscriber_conn_id: str
) -> None:
    """``failover`` makes the publisher's slot a failover slot: from 17 it is one; before, the
    task fails naming the publisher's version, and nothing is created on either side."""
    subscriber.execute("CREATE TABLE IF NOT EXISTS ops_fo_t (id int PRIMARY KEY)")
    publisher.execute("CREATE TABLE IF NOT EXISTS ops_fo_t (id int PRIMARY KEY)")
    CreatePublicationOperator(
        task_id="p", publication="ops_fo_pub", postgres_conn_id=publisher_conn_id,
        tables=["ops_fo_t"],
    ).execute(context())  # fmt: skip
    create = CreateSubscriptionOperator(
        task_id="s", subscription="ops_fo_sub", publications=["ops_fo_pub"],
        publisher_conn_id=publisher_conn_id, subscriber_conn_id=subscriber_conn_id,
        failover=True,
    )  # fmt: skip
    slot = "SELECT to_jsonb(s)->>'failover' FROM pg_replication_slots s WHERE slot_name = %s"
    try:
        if int(publisher.execute("SHOW server_version_num")[0][0]) < 170000:
            with pytest.raises(Exception, match=r"FailoverSlotUnsupportedError.*PostgreSQL 17"):
                create.execute(context())
            assert publisher.execute(slot, ("ops_fo_sub",)) == []
            assert subscriber.execute(
                "SELECT 1 FROM pg_subscription WHERE subname = 'ops_fo_sub'") == []  # fmt: skip
        else:
            create.execute(context())
            assert publisher.execute(slot, ("ops_fo_sub",)) == [("true",)]
    finally:
        DropSubscriptionOperator(
            task_id="d", subscription="ops_fo_sub", subscriber_conn_id=subscriber_conn_id
        ).execute(context())
        DropPublicationOperator(
            task_id="dp", publication="ops_fo_pub", postgres_conn_id=publisher_conn_id
        ).execute(context())
