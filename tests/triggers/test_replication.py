"""Triggers serialise to (classpath, kwargs) and rebuild equal."""

from __future__ import annotations

import importlib

import pytest

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
