"""Subscription life cycle edges: alter actions, drop with an unreachable publisher, slot health."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.operators.publication import (
    CreatePublicationOperator,
    DropPublicationOperator,
)
from airflow_pglogrepl.operators.slots import (
    CreateReplicationSlotOperator,
    DropReplicationSlotOperator,
    SlotHealthCheckOperator,
)
from airflow_pglogrepl.operators.subscription import (
    AlterSubscriptionOperator,
    CreateSubscriptionOperator,
    DropSubscriptionOperator,
)
from airflow_pglogrepl.testing.pgcluster import PgCluster, local_cluster
from airflow_pglogrepl.testing.wait import wait_until
from tests.conftest import set_airflow_connection

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion


class FakeTI:
    """Just enough of a TaskInstance for operators that push and pull XCom."""

    def __init__(self, previous: Any = None) -> None:
        self.pushed: dict[str, Any] = {}
        self.previous = previous

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, **kwargs: Any) -> Any:
        return self.previous


def _ctx(ti: FakeTI | None = None) -> Any:
    return {"ti": ti or FakeTI()}


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
    ).execute(_ctx())
    CreateSubscriptionOperator(
        task_id="s", subscription=name, publications=["ops_pub"],
        publisher_conn_id=publisher_conn, subscriber_conn_id="pglogrepl_subscriber",
    ).execute(_ctx())  # fmt: skip


def _subscribe_table(publisher_conn: str, name: str, table: str) -> None:
    CreatePublicationOperator(
        task_id="p", publication="ops_pub", postgres_conn_id=publisher_conn, tables=[table]
    ).execute(_ctx())
    CreateSubscriptionOperator(
        task_id="s", subscription=name, publications=["ops_pub"],
        publisher_conn_id=publisher_conn, subscriber_conn_id="pglogrepl_subscriber",
    ).execute(_ctx())  # fmt: skip


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
    ).execute(_ctx())
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
    assert drop.execute(_ctx())["slot_left_behind"] is None
    assert "ops_reachable" not in [s.name for s in pub_hook.list_slots()]
    assert drop.execute(_ctx())["dropped"] is False
    assert DropPublicationOperator(
        task_id="x", publication="ops_pub", postgres_conn_id=publisher_conn_id
    ).execute(_ctx()) == {"publication": "ops_pub", "dropped": True}


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
        ).execute(_ctx())  # fmt: skip

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
    ).execute(_ctx())  # fmt: skip
    alter("refresh")
    wait_until(lambda: subscriber.execute("SELECT count(*) FROM ops_added") == [(10,)],
               what="ops_added copied")  # fmt: skip
    hook.drop_subscription("ops_alter")
    with pytest.raises(Exception, match="does not exist"):
        alter("enable")


def test_slot_operators_and_health(publisher: PgCluster, publisher_conn_id: str) -> None:
    create = CreateReplicationSlotOperator(
        task_id="c", slot_name="ops_health", postgres_conn_id=publisher_conn_id
    )
    first, second = create.execute(_ctx()), create.execute(_ctx())
    assert first["created"] is True and second["created"] is False
    publisher.execute("CREATE TABLE IF NOT EXISTS ops_wal (x text)")
    publisher.execute("INSERT INTO ops_wal SELECT repeat('x', 1000) FROM generate_series(1, 200)")

    healthy = SlotHealthCheckOperator(
        task_id="h", slot_name="ops_health", postgres_conn_id=publisher_conn_id,
        plugin="pgoutput", max_retained_bytes=10**9, max_inactive=dt.timedelta(hours=1),
    ).execute(_ctx())  # fmt: skip
    assert healthy["problems"] == [] and healthy["retained_bytes"] > 100_000
    assert healthy["observed_inactive_since"] is not None
    # whose clock: the server's own from 17 (pg_replication_slots.inactive_since); before, the
    # first run of this task that saw the slot inactive
    own_clock = int(publisher.execute("SHOW server_version_num")[0][0]) >= 170000
    source = "server: pg_replication_slots" if own_clock else "this task"
    assert healthy["inactive_since_source"].startswith(source), healthy

    # 15 to 16 go by the earlier run's XCom; 17+ by the server, whose clock has the slot idle
    # for a moment already: over a limit of a millisecond either way
    ti = FakeTI(previous={"observed_inactive_since": "2020-01-01T00:00:00+00:00"})
    with pytest.raises(Exception, match="slot health check failed") as info:
        SlotHealthCheckOperator(
            task_id="h", slot_name="ops_health", postgres_conn_id=publisher_conn_id,
            plugin="test_decoding", max_retained_bytes=1000,
            max_inactive=dt.timedelta(milliseconds=1),
        ).execute(_ctx(ti))  # fmt: skip
    text = str(info.value)
    assert "uses plugin 'pgoutput'" in text and "retains" in text and "inactive for" in text
    record = ti.pushed["return_value"]
    assert len(record["problems"]) == 3 and record["inactive_since_source"].startswith(source)
    seen = record["observed_inactive_since"]
    assert seen.startswith("2020") != own_clock, seen

    assert DropReplicationSlotOperator(
        task_id="d", slot_name="ops_health", postgres_conn_id=publisher_conn_id
    ).execute(_ctx()) == {"slot": "ops_health", "dropped": True}


def test_a_temp_file_limit_below_the_slots_transactions_is_reported(
    publisher: PgCluster,
) -> None:
    """A peek holds whole transactions in a temporary file: with temp_file_limit below one, the
    drain fails every time. Slot health names it from pg_stat_replication_slots, and the
    peek's failure names temp_file_limit. Before: healthy, and the error was reported as
    max_replication_slots exhausted (both are SQLSTATE 53400)."""
    from airflow_pglogrepl.exceptions import ServerNotConfiguredError
    from airflow_pglogrepl.hooks.pg.source import PgSource

    db = "ops_temp_limit"
    publisher.create_database(db)
    conn_id = "ops_temp_limit"
    set_airflow_connection(conn_id, publisher.airflow_uri(db))
    publisher.execute(f"ALTER DATABASE {db} SET logical_decoding_work_mem = '64kB'")
    publisher.execute("CREATE TABLE big (id int PRIMARY KEY, pad text);"
                      " CREATE PUBLICATION big_pub FOR TABLE big", dbname=db)  # fmt: skip
    publisher.execute("SELECT pg_create_logical_replication_slot('ops_temp', 'pgoutput')",
                      dbname=db)  # fmt: skip
    publisher.execute("INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g",
                      dbname=db)  # fmt: skip
    source = PgSource(publisher.dsn(db))
    options = {"proto_version": "1", "publication_names": "big_pub"}
    assert sum(1 for _ in source.peek_changes("ops_temp", upto_lsn=None, options=options)) > 20000
    hook = PgLogicalReplicationHook(postgres_conn_id=conn_id)
    wait_until(lambda: (spill := hook.slot_spill("ops_temp")) is not None and spill.spill_txns > 0,
               what="the peek's spill counted")  # fmt: skip
    publisher.execute(f"ALTER DATABASE {db} SET temp_file_limit = '1MB'")
    facts = hook.server_facts()  # what preflight reports from
    assert facts.temp_file_limit == 1 << 20
    assert (facts.largest_decoded_transaction or 0) >= 1 << 20
    try:
        ti = FakeTI()
        with pytest.raises(Exception, match=r"temp_file_limit is 1048576 bytes.*at least"):
            SlotHealthCheckOperator(
                task_id="h", slot_name="ops_temp", postgres_conn_id=conn_id,
            ).execute(_ctx(ti))  # fmt: skip
        assert ti.pushed["return_value"]["decoding"]["spill_txns"] >= 1
        with pytest.raises(ServerNotConfiguredError, match=r"temp_file_limit is '1MB'.*-1"):
            list(PgSource(publisher.dsn(db)).peek_changes("ops_temp", upto_lsn=None,
                                                          options=options))  # fmt: skip
    finally:
        publisher.execute("SELECT pg_drop_replication_slot('ops_temp')", dbname=db)


def test_options_newer_than_the_subscriber_are_refused_before_anything_is_sent(
    subscriber: PgCluster, publisher: PgCluster
) -> None:
    """origin, password_required, run_as_owner and streaming = parallel came with 16, failover
    with 17: an older subscriber refuses them naming the version; a newer one takes them."""
    from airflow_pglogrepl.hooks.replication import DsnReplicationHook

    hook = DsnReplicationHook(subscriber.dsn())
    major = int(subscriber.execute("SHOW server_version_num")[0][0]) // 10000
    params = publisher.params()
    for options, since in (({"origin": "none"}, 16), ({"streaming": "parallel"}, 16),
                           ({"failover": False}, 17)):  # fmt: skip
        create = {"connect": False, "enabled": False, "create_slot": False, **options}
        if major < since:
            with pytest.raises(ValueError, match=f"PostgreSQL {major}, which has no .*{since}"):
                hook.ensure_subscription("too_new", publisher_params=params,
                                         publications=["p"], options=create)  # fmt: skip
            assert hook.get_subscription("too_new") is None
        else:
            made = hook.ensure_subscription("too_new", publisher_params=params,
                                            publications=["p"], options=create)  # fmt: skip
            assert made.action == "created"
            # read back from the catalog: running it again changes nothing
            again = hook.ensure_subscription("too_new", publisher_params=params,
                                             publications=["p"], options=create)  # fmt: skip
            assert again.action == "unchanged", again.details
            hook.drop_subscription("too_new")
