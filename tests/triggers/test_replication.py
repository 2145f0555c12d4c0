"""Triggers serialise to (classpath, kwargs) and rebuild equal; probes reject impossible setups."""

from __future__ import annotations

import importlib

import pytest

from airflow_pglogrepl.exceptions import InvalidLSNError
from airflow_pglogrepl.operators.subscription import slot_name_for
from airflow_pglogrepl.sensors.probes import ProgressProbe
from airflow_pglogrepl.triggers.replication import (
    ReplicationProgressTrigger,
    SubscriptionReadyTrigger,
)


@pytest.mark.parametrize(
    "trigger",
    [
        SubscriptionReadyTrigger(poll_interval=2, subscriber_conn_id="s", subscription="x",
                                 max_sync_errors=4, worker_grace_s=9.0),
        ReplicationProgressTrigger(poll_interval=1, publisher_conn_id="p", slot_name="slot",
                                   max_lag_bytes=10, target_lsn=None),
        ReplicationProgressTrigger(poll_interval=1, subscriber_conn_id="s", subscription="x",
                                   target_lsn="0/16B3748"),
    ],
)  # fmt: skip
def test_serialize_round_trip(trigger: object) -> None:
    classpath, kwargs = trigger.serialize()  # type: ignore[attr-defined]
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert type(rebuilt) is type(trigger)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.probe == trigger.probe  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slot_name": "s", "max_lag_bytes": 1}, "publisher_conn_id"),
        ({"subscription": "x", "target_lsn": "0/1"}, "subscriber_conn_id"),
        ({"publisher_conn_id": "p", "max_lag_bytes": 1}, "name a slot"),
        ({"publisher_conn_id": "p", "slot_name": "s"}, "max_lag_bytes, target_lsn"),
        ({"subscriber_conn_id": "s", "subscription": "x", "max_lag_bytes": 5}, "name the slot"),
    ],
)
def test_impossible_probes_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProgressProbe(**kwargs)  # type: ignore[arg-type]


def test_bad_target_lsn_is_named() -> None:
    with pytest.raises(InvalidLSNError, match="'fence'"):
        ProgressProbe(publisher_conn_id="p", slot_name="s", target_lsn="fence")


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
