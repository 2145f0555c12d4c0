"""``ReplicationLagSensor`` and ``LsnCatchUpSensor`` (``sensors.progress``): what they measure,
from the arguments they are given (a templated target trimmed, a subscription that only names
the slot left out of a lag check, the slot looked up from the subscription, the trigger
carrying the same probe), and their verdicts on a live slot: caught up at its confirmed
position, waiting before it, a slot that does not exist failing the task at once."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.sensors.progress import LsnCatchUpSensor, ReplicationLagSensor
from tests.support.airflow import FakeTI, context, set_airflow_connection
from tests.support.sources import Source


def test_a_templated_target_is_trimmed_and_the_trigger_carries_the_same_probe() -> None:
    sensor = LsnCatchUpSensor(task_id="catch_up", publisher_conn_id="pub", slot_name="s",
                              target_lsn=" 0/16B3748\n", poke_interval=7)  # fmt: skip
    probe = sensor._probe()
    assert probe.target_lsn == "0/16B3748" and probe.slot_name == "s"
    module, kwargs = sensor.trigger().serialize()
    assert module == "airflow_pglogrepl.triggers.replication.ReplicationProgressTrigger"
    assert kwargs == {"poll_interval": 7, **probe.kwargs()}


def test_a_lag_check_with_a_named_slot_measures_on_the_publisher_alone() -> None:
    """A subscription given beside the slot (only to name it) must not make the lag check wait
    for a subscriber-side target that was never asked for."""
    sensor = ReplicationLagSensor(task_id="lag", publisher_conn_id="pub", slot_name="s",
                                  subscriber_conn_id="sub", subscription="sub",
                                  max_lag_bytes=1024)  # fmt: skip
    probe = sensor._probe()
    assert (probe.slot_name, probe.subscription, probe.max_lag_bytes) == ("s", None, 1024)
    both = ReplicationLagSensor(task_id="lag_and_target", publisher_conn_id="pub", slot_name="s",
                                subscriber_conn_id="sub", subscription="sub", max_lag_bytes=1,
                                target_lsn="0/1")  # fmt: skip
    assert both._probe().subscription == "sub"  # the target is the subscriber's


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [({"slot_name": "s"}, "slot_name needs publisher_conn_id"),
     ({"publisher_conn_id": "pub"}, "name a slot"),
     ({"publisher_conn_id": "pub", "slot_name": "s", "target_lsn": "16B3748"}, "16B3748")],
)  # fmt: skip
def test_a_sensor_without_something_to_measure_says_what_is_missing(
    kwargs: dict[str, str], said: str
) -> None:
    kwargs.setdefault("target_lsn", "0/1")
    sensor = LsnCatchUpSensor(task_id="catch_up", **kwargs)
    with pytest.raises(ValueError, match=said):
        sensor.verdict()


@pytest.fixture
def conn_id(source: Source) -> str:
    name = f"progress_{source.db}"
    set_airflow_connection(name, source.cluster.airflow_uri(source.db))
    return name


def test_a_slot_is_caught_up_at_its_confirmed_position_and_not_before(
    source: Source, conn_id: str
) -> None:
    (confirmed,) = source.sql(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (source.slot,),
    )[0]

    def sensor(target: LSN) -> LsnCatchUpSensor:
        return LsnCatchUpSensor(task_id="catch_up", publisher_conn_id=conn_id,
                                slot_name=source.slot, target_lsn=str(target))  # fmt: skip

    reached = sensor(LSN(confirmed)).verdict()
    assert reached.done and not reached.failed and reached.data["behind_bytes"] == 0
    ahead = sensor(LSN(confirmed) + 16).verdict()
    assert not ahead.done and not ahead.failed and ahead.data["behind_bytes"] == 16
    lag = ReplicationLagSensor(task_id="lag", publisher_conn_id=conn_id, slot_name=source.slot,
                               max_lag_bytes=1 << 40).verdict()  # fmt: skip
    assert lag.done and lag.data["lag_bytes"] >= 0


def test_a_slot_that_does_not_exist_fails_the_task_at_once(conn_id: str) -> None:
    ti = FakeTI()
    sensor = LsnCatchUpSensor(task_id="catch_up", publisher_conn_id=conn_id,
                              slot_name="no_such_slot", target_lsn="0/1")  # fmt: skip
    with pytest.raises(AirflowFailException, match=r"replication slot 'no_such_slot' does not "
                       r"exist on the publisher\. Fix: check the slot name"):  # fmt: skip
        sensor.poke(context(ti))


def test_a_subscription_that_does_not_exist_names_the_fix(publisher_conn_id: str) -> None:
    """The slot of a subscription is looked up on the subscriber (any cluster can be asked)."""
    sensor = ReplicationLagSensor(task_id="lag", publisher_conn_id=publisher_conn_id,
                                  subscriber_conn_id=publisher_conn_id,
                                  subscription="no_such_sub", max_lag_bytes=1)  # fmt: skip
    with pytest.raises(ObjectNotFoundError, match=r"no_such_sub.*pass slot_name"):
        sensor.verdict()
