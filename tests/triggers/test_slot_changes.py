"""The slot's event trigger: once per burst of published changes, never while idle."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from typing import Any

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import SlotInfo
from airflow_pglogrepl.triggers.slot_changes import Fired, SlotChangesTrigger, burst
from tests.support.airflow import set_airflow_connection
from tests.support.sources import Source


def slot(confirmed: int, current: int, *, active: bool = False, retained: int = 0) -> SlotInfo:
    return SlotInfo(name="s", plugin="pgoutput", slot_type="logical", database="d",
                    temporary=False, active=active, active_pid=None, restart_lsn=LSN(confirmed),
                    confirmed_flush_lsn=LSN(confirmed), wal_status="reserved",
                    safe_wal_size=None, two_phase=False, retained_bytes=retained,
                    current_lsn=LSN(current))  # fmt: skip


def decide(found: SlotInfo, fired: Fired | None = None, now: float = 100.0, **kw: Any) -> Any:
    kw = {"min_lag_bytes": 1, "max_retained_bytes": None, "refire_after_s": 60.0, **kw}
    return burst(found, fired, now=now, **kw)


def test_a_burst_begins_behind_the_wal_and_waits_for_the_drain_of_the_last() -> None:
    assert decide(slot(100, 100)) is None  # caught up
    assert decide(slot(100, 150)) == "lag 50 bytes >= 1"
    assert decide(slot(100, 150), min_lag_bytes=64) is None
    fired = Fired(LSN(150), 90.0)
    assert decide(slot(100, 200), fired) is None  # the event's drain has not got there yet
    assert decide(slot(150, 200), fired) == "lag 50 bytes >= 1"  # drained: a new burst
    assert decide(slot(100, 200), fired, now=151.0) == "lag 100 bytes >= 1"  # no drain came
    assert decide(slot(100, 150, active=True)) is None  # a drain reads it now


def test_wal_the_slot_pins_fires_whatever_the_changes() -> None:
    pinned = slot(100, 100, active=True, retained=10_000)
    assert decide(pinned, max_retained_bytes=5_000) == "retained WAL 10000 bytes >= 5000"
    assert decide(pinned, Fired(LSN(120), 90.0), max_retained_bytes=5_000) is None


def test_serialize_round_trip() -> None:
    trigger = SlotChangesTrigger(postgres_conn_id="p", slot_name="s", publications=["a", "b"],
                                 poll_interval=5, min_lag_bytes=7, max_retained_bytes=9,
                                 check_changes=False, refire_after_s=11)  # fmt: skip
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    with pytest.raises(ValueError, match="poll_interval"):
        SlotChangesTrigger(postgres_conn_id="p", slot_name="s", publications=[], poll_interval=0)


@pytest.fixture
def watched(source: Source) -> SlotChangesTrigger:
    """A published table ``t`` and an unpublished ``other``; the slot caught up."""
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql("CREATE TABLE other (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    advance(source)
    conn_id = f"slot_changes_{source.db}"
    set_airflow_connection(conn_id, source.cluster.airflow_uri(source.db))
    return SlotChangesTrigger(postgres_conn_id=conn_id, slot_name=source.slot,
                              publications=[source.publication], poll_interval=0.05)  # fmt: skip


def advance(source: Source) -> LSN:
    """What a drain does to the slot: confirm everything so far."""
    rows = source.sql("SELECT end_lsn::text FROM pg_replication_slot_advance(%s, "
                      "pg_current_wal_lsn())", (source.slot,))  # fmt: skip
    return LSN(str(rows[0][0]))


@pytest.mark.pgversion
def test_only_a_published_change_starts_a_burst_and_one_event_takes_it(
    source: Source, watched: SlotChangesTrigger
) -> None:
    assert asyncio.run(watched.check(None)) is None  # idle
    source.sql("INSERT INTO other SELECT generate_series(1, 50)")  # WAL moves, nothing published
    assert asyncio.run(watched.check(None)) is None
    source.sql("INSERT INTO t VALUES (1)")
    payload = asyncio.run(watched.check(None))
    assert payload is not None and payload["reason"].startswith("a published change waits")
    assert payload["slot"] == source.slot and payload["lag_bytes"] > 0
    fired = Fired(LSN(payload["wal_lsn"]), 1e12)  # (now: well within refire_after_s)

    async def events_over(polls: int, *, expect: int) -> list[Any]:
        """The events ``run`` yields: waited for up to 30 s while fewer than ``expect`` came,
        then watched for ``polls`` more polls (an event too many would come in them)."""
        got: list[Any] = []

        async def collect() -> None:
            async for event in watched.run():
                got.append(event.payload)

        task = asyncio.ensure_future(collect())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(got) < expect and loop.time() < deadline:
            await asyncio.sleep(watched.poll_interval)
        await asyncio.sleep(watched.poll_interval * polls)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return got

    watched._fired = None
    assert len(asyncio.run(events_over(20, expect=1))) == 1  # a burst, many polls: one event
    source.sql("INSERT INTO t VALUES (2)")
    assert asyncio.run(events_over(10, expect=0)) == []  # the first event's drain has not run yet
    advance(source)
    assert asyncio.run(watched.check(fired)) is None  # drained: idle again
    source.sql("INSERT INTO t VALUES (3)")
    assert asyncio.run(watched.check(fired)) is not None  # a new burst
    assert (
        len(asyncio.run(events_over(10, expect=1))) == 1
    )  # drained since the last event: one more


@pytest.mark.pgversion
def test_a_slot_that_is_gone_or_unreachable_fires_nothing_and_the_watch_goes_on(
    source: Source, watched: SlotChangesTrigger
) -> None:
    missing = SlotChangesTrigger(postgres_conn_id=watched.postgres_conn_id, slot_name="nope",
                                 publications=watched.publications)  # fmt: skip
    assert asyncio.run(missing.check(None)) is None


def test_the_example_drain_dag_is_scheduled_on_the_slots_changes_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PGLOGREPL_DRAIN_SCHEDULE=changes``: the drain DAG runs on an Asset this trigger
    watches (polling every ``PGLOGREPL_TRIGGER_POLL_SECONDS``); the report DAG on the state
    Asset of one table."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.support.paths import REPO

    monkeypatch.setenv("PGLOGREPL_DRAIN_SCHEDULE", "changes")
    monkeypatch.setenv("PGLOGREPL_SLOT", "my_slot")
    monkeypatch.setenv("PGLOGREPL_TRIGGER_POLL_SECONDS", "1.5")
    bag = DagBag(dag_folder=str(REPO / "dags" / "pglogrepl_incremental_drain.py"))
    assert not bag.import_errors, bag.import_errors
    drain = bag.dags["pglogrepl_incremental_drain"]
    (asset,) = drain.timetable.asset_condition.objects
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, SlotChangesTrigger)
    assert watcher.trigger.slot_name == "my_slot" and watcher.trigger.poll_interval == 1.5
    report = bag.dags["pglogrepl_table_report"]
    (watched,) = report.timetable.asset_condition.objects
    assert watched.uri.startswith("pglogrepl+file:") and watched.uri.endswith(
        "/state/public.pgbench_accounts"
    )


def test_a_run_holding_the_lakes_writer_lock_is_left_the_slot(
    source: Source, watched: SlotChangesTrigger
) -> None:
    """A drain or snapshot takes the lake's writer lock before it reads the slot: a peek then
    would hold the slot it is about to read ('replication slot ... is active for PID')."""
    source.sql("INSERT INTO t VALUES (1)")
    with source.hook().writer_lock(source.slot):
        assert asyncio.run(watched.check(None)) is None
    payload = asyncio.run(watched.check(None))
    assert payload is not None and payload["reason"].startswith("a published change waits")
