"""Capacity and server settings on hand-built catalog facts: slots, senders, workers, origins,
wal_level and the role, temp_file_limit, the idle slot timeout.
"""

from __future__ import annotations

from airflow_pglogrepl.models.facts import PublisherUsage, RoleFacts, SubscriberUsage
from airflow_pglogrepl.preflight import Check, evaluate
from airflow_pglogrepl.preflight.sizing import demand
from tests.support.preflight import inspection, keyed, server

# -- sizing -----------------------------------------------------------------------------------


def test_demand_caps_sync_workers_at_the_table_count() -> None:
    one = inspection([keyed("a")])
    assert demand(one).total == 2  # 1 apply + min(2 sync, 1 table)
    three = inspection([keyed("a"), keyed("b"), keyed("c")], planned=3)
    assert demand(three).total == 9  # 3 x (1 + 2)


def test_publisher_capacity_counts_what_is_in_use() -> None:
    report = evaluate(
        inspection(
            [keyed("a"), keyed("b")],
            planned=2,
            pub_usage=PublisherUsage(slots_in_use=8, wal_senders_in_use=3),
        )
    )
    by_check = {f.check: f for f in report.problems}
    slots = by_check[Check.REPLICATION_SLOTS]
    assert "max_replication_slots is 10 with 8 slots" in slots.message
    assert "2 free; 6 needed" in slots.message
    assert "raise max_replication_slots by 4 to 14" in slots.fix
    assert "restart" in slots.fix
    assert Check.WAL_SENDERS not in by_check  # 7 free, 6 needed
    assert report.capacity["publisher"]["replication_slots_in_use"] == 8
    assert report.capacity["publisher"]["needed"] == 6


def test_subscriber_capacity_and_worker_processes() -> None:
    report = evaluate(
        inspection(
            [keyed("a"), keyed("b")],
            sub_server=server(
                max_logical_replication_workers=8, max_worker_processes=8, max_replication_slots=8
            ),
            sub_usage=SubscriberUsage(
                subscriptions=3, enabled_subscriptions=2, extra_workers_running=4
            ),
        )
    )
    by_check = {f.check: f for f in report.problems}
    workers = by_check[Check.LOGICAL_WORKERS]
    assert "max_logical_replication_workers is 8 with 6 workers" in workers.message
    assert "raise max_logical_replication_workers by 1 to 9" in workers.fix
    assert "max_worker_processes (8) must then be raised to at least 10" in workers.fix
    processes = by_check[Check.WORKER_PROCESSES]
    assert "raise max_worker_processes by 1 to 9" in processes.fix
    origins = by_check[Check.REPLICATION_ORIGINS]
    assert "max_replication_slots is 8 with 7 replication origins" in origins.message
    assert "leaving 1 free; 3 needed" in origins.message
    assert "raise max_replication_slots by 2 to 10" in origins.fix


def test_origins_are_counted_against_their_own_setting_from_postgresql_18() -> None:
    """18 caps origins by max_active_replication_origins (default 10), no longer by
    max_replication_slots. Before: no check at all on 18, so 20 planned subscriptions on a
    subscriber that can run 10 passed as ready."""
    fits = evaluate(
        inspection(
            [keyed("a")],
            sub_server=server(
                version_num=180000, max_replication_slots=0, max_active_replication_origins=10
            ),
        )
    )
    assert Check.REPLICATION_ORIGINS.value not in fits.checks()
    report = evaluate(inspection([keyed("a")], planned=20, sub_server=server(
        version_num=180000, max_replication_slots=100, max_active_replication_origins=10,
        max_logical_replication_workers=100, max_worker_processes=200)))  # fmt: skip
    origins = next(f for f in report.problems if f.check is Check.REPLICATION_ORIGINS)
    assert origins.message.startswith("max_active_replication_origins is 10")
    assert "max_active_replication_origins" in origins.fix
    assert not report.ok


def test_wal_level_and_role() -> None:
    report = evaluate(
        inspection(
            [keyed("a")],
            pub_server=server(wal_level="replica"),
            role=RoleFacts("app", superuser=False, replication=False),
        )
    )
    assert {Check.WAL_LEVEL.value, Check.REPLICATION_ROLE.value} <= report.checks()
    role = next(f for f in report.problems if f.check is Check.REPLICATION_ROLE)
    assert 'ALTER ROLE "app" REPLICATION' in role.fix
    ok = evaluate(inspection([keyed("a")], role=RoleFacts("r", superuser=False, replication=True)))
    assert ok.ok, ok.summary()


def test_temp_file_limit_is_reported_against_the_biggest_transaction_decoded() -> None:
    unlimited = evaluate(inspection([keyed("a")]))
    assert Check.TEMP_FILE_LIMIT.value not in unlimited.checks()
    limited = evaluate(
        inspection([keyed("a")], pub_server=server(temp_file_limit=1 << 20,
                                                   largest_decoded_transaction=3 << 20))
    )  # fmt: skip
    (finding,) = [f for f in limited.warnings if f.check is Check.TEMP_FILE_LIMIT]
    assert "1048576 bytes" in finding.message and "at least 3145728 bytes" in finding.message
    assert "above it" in finding.message and "temp_file_limit = -1" in finding.fix
    assert limited.ok  # a warning: subscriptions do not peek


def test_an_idle_slot_timeout_is_a_warning_for_drains() -> None:
    """PostgreSQL 18's idle_replication_slot_timeout invalidates a drain's slot between runs
    scheduled further apart than it."""
    assert Check.IDLE_SLOT_TIMEOUT.value not in evaluate(inspection([keyed("a")])).checks()
    report = evaluate(
        inspection([keyed("a")], pub_server=server(idle_replication_slot_timeout_s=3600))
    )
    (finding,) = [f for f in report.warnings if f.check is Check.IDLE_SLOT_TIMEOUT]
    assert "3600 s" in finding.message and "= 0 (off)" in finding.fix
    assert report.ok
