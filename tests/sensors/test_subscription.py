"""``SubscriptionReadySensor`` (``sensors.subscription``) on a live subscriber: a subscription
that does not exist fails the task at once, one with no tables yet is waited for, one disabled
while its tables are not ready fails at once with the fix, and only an existing subscription
reports its metrics; deferred, its trigger carries the same thresholds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_pglogrepl import metrics
from airflow_pglogrepl.sensors.subscription import SubscriptionReadySensor
from tests.support.airflow import FakeTI, context, set_airflow_connection
from tests.support.sources import Source


def test_the_trigger_carries_the_sensors_thresholds() -> None:
    sensor = SubscriptionReadySensor(task_id="ready", subscription="sub", subscriber_conn_id="c",
                                     subscriber_database="db", max_sync_errors=5,
                                     worker_grace_period=12.5, poke_interval=3)  # fmt: skip
    module, kwargs = sensor.trigger().serialize()
    assert module == "airflow_pglogrepl.triggers.replication.SubscriptionReadyTrigger"
    assert kwargs == {"poll_interval": 3, "subscriber_conn_id": "c", "subscription": "sub",
                      "subscriber_database": "db", "max_sync_errors": 5,
                      "worker_grace_s": 12.5}  # fmt: skip


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the sensor reported to the metrics (``metrics.subscription``)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(metrics, "subscription", lambda name, **kw: calls.append({name: kw}))
    return calls


@pytest.fixture
def subscriber(source: Source) -> Iterator[tuple[Source, str]]:
    """The source's database as a subscriber (a subscription can be made on any cluster), with
    a published table in it to subscribe to, and its Airflow connection."""
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    conn_id = f"ready_{source.db}"
    set_airflow_connection(conn_id, source.cluster.airflow_uri(source.db))
    yield source, conn_id
    mine = source.sql("SELECT subname FROM pg_subscription s JOIN pg_database d ON "
                      "d.oid = s.subdbid WHERE d.datname = current_database()")  # fmt: skip
    for (name,) in mine:
        source.sql(f'ALTER SUBSCRIPTION "{name}" DISABLE')
        source.sql(f'ALTER SUBSCRIPTION "{name}" SET (slot_name = NONE)')
        source.sql(f'DROP SUBSCRIPTION "{name}"')


def _sensor(conn_id: str, name: str) -> SubscriptionReadySensor:
    return SubscriptionReadySensor(task_id="ready", subscription=name, subscriber_conn_id=conn_id)


def test_a_subscription_that_does_not_exist_fails_at_once_and_reports_nothing(
    subscriber: tuple[Source, str], reported: list[dict[str, Any]]
) -> None:
    _, conn_id = subscriber
    with pytest.raises(AirflowFailException, match=r"subscription 'nope' does not exist on the "
                       r"subscriber\. Fix: create it first"):  # fmt: skip
        _sensor(conn_id, "nope").poke(context())
    assert reported == []


def test_a_subscription_without_tables_yet_is_waited_for(
    subscriber: tuple[Source, str], reported: list[dict[str, Any]]
) -> None:
    source, conn_id = subscriber
    source.sql(f"CREATE SUBSCRIPTION empty_sub CONNECTION '{source.dsn}' PUBLICATION "
               f"{source.publication} WITH (connect = false)")  # fmt: skip
    ti = FakeTI()
    assert _sensor(conn_id, "empty_sub").poke(context(ti)) is False
    assert ti.pushed["observed"]["name"] == "empty_sub"
    assert reported == [{"empty_sub": {"tables_not_ready": 0, "apply_errors": 0}}]


def test_a_disabled_subscription_with_tables_not_ready_fails_at_once_with_the_fix(
    subscriber: tuple[Source, str], reported: list[dict[str, Any]]
) -> None:
    source, conn_id = subscriber
    # connected once (its tables listed), no slot made, never enabled: nothing will sync them
    source.sql(f"CREATE SUBSCRIPTION idle_sub CONNECTION '{source.dsn}' PUBLICATION "
               f"{source.publication} WITH (create_slot = false, enabled = false, "
               f"slot_name = NONE)")  # fmt: skip
    told = (
        r"subscription 'idle_sub' is disabled while tables are not ready: public\.t .*"
        r"Fix: ALTER SUBSCRIPTION \.\.\. ENABLE"
    )
    with pytest.raises(AirflowFailException, match=told):
        _sensor(conn_id, "idle_sub").poke(context())
    assert reported == [{"idle_sub": {"tables_not_ready": 1, "apply_errors": 0}}]
