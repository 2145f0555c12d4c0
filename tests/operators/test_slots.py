"""Slot operators and the slot health check against the live publisher."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.operators.slots import (
    CreateReplicationSlotOperator,
    DropReplicationSlotOperator,
    SlotHealthCheckOperator,
)
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.airflow import FakeTI, context, set_airflow_connection

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion


def test_slot_operators_and_health(publisher: PgCluster, publisher_conn_id: str) -> None:
    create = CreateReplicationSlotOperator(
        task_id="c", slot_name="ops_health", postgres_conn_id=publisher_conn_id
    )
    first, second = create.execute(context()), create.execute(context())
    assert first["created"] is True and second["created"] is False
    publisher.execute("CREATE TABLE IF NOT EXISTS ops_wal (x text)")
    publisher.execute("INSERT INTO ops_wal SELECT repeat('x', 1000) FROM generate_series(1, 200)")

    healthy = SlotHealthCheckOperator(
        task_id="h", slot_name="ops_health", postgres_conn_id=publisher_conn_id,
        plugin="pgoutput", max_retained_bytes=10**9, max_inactive=dt.timedelta(hours=1),
    ).execute(context())  # fmt: skip
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
        ).execute(context(ti))  # fmt: skip
    text = str(info.value)
    assert "uses plugin 'pgoutput'" in text and "retains" in text and "inactive for" in text
    record = ti.pushed["return_value"]
    assert len(record["problems"]) == 3 and record["inactive_since_source"].startswith(source)
    seen = record["observed_inactive_since"]
    assert seen.startswith("2020") != own_clock, seen

    assert DropReplicationSlotOperator(
        task_id="d", slot_name="ops_health", postgres_conn_id=publisher_conn_id
    ).execute(context()) == {"slot": "ops_health", "dropped": True}


def test_a_temp_file_limit_below_the_slots_transactions_is_reported(
    publisher: PgCluster,
) -> None:
    """A peek holds whole transactions in a temporary file: with temp_file_limit below one, the
    drain fails every time. Slot health names it from pg_stat_replication_slots, and the
    peek's failure names temp_file_limit. Before: healthy, and the error was reported as
    max_replication_slots exhausted (both are SQLSTATE 53400)."""
    from airflow_pglogrepl.exceptions import ServerNotConfiguredError
    from airflow_pglogrepl.postgres.source import PgSource

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
            ).execute(context(ti))  # fmt: skip
        assert ti.pushed["return_value"]["decoding"]["spill_txns"] >= 1
        with pytest.raises(ServerNotConfiguredError, match=r"temp_file_limit is '1MB'.*-1"):
            list(PgSource(publisher.dsn(db)).peek_changes("ops_temp", upto_lsn=None,
                                                          options=options))  # fmt: skip
    finally:
        publisher.execute("SELECT pg_drop_replication_slot('ops_temp')", dbname=db)


def test_the_slot_operator_makes_failover_slots_where_the_server_can_keep_them(
    publisher: PgCluster, publisher_conn_id: str
) -> None:
    can = int(publisher.execute("SHOW server_version_num")[0][0]) >= 170000

    def create(**kw: object) -> dict[str, object]:
        return CreateReplicationSlotOperator(task_id="c", slot_name="ops_fo",
                                             postgres_conn_id=publisher_conn_id,
                                             **kw).execute(context())  # type: ignore[arg-type]  # fmt: skip

    def drop() -> None:
        DropReplicationSlotOperator(
            task_id="d", slot_name="ops_fo", postgres_conn_id=publisher_conn_id
        ).execute(context())

    try:
        assert create()["failover"] is can  # a new slot
        drop()
        publisher.execute("SELECT pg_create_logical_replication_slot('ops_fo', 'pgoutput')")
        assert create(failover=False)["failover"] is False  # left as it is
        kept = create()  # and by default too: its reads would wait for standbys from then on
        assert kept["created"] is False and kept["failover"] is False
        if can:
            assert create(failover=True)["failover"] is True  # made one, when asked
        else:
            # (the task boundary fails the task with the error's name and text)
            with pytest.raises(
                Exception, match=r"FailoverSlotUnsupportedError.*need PostgreSQL 17"
            ):
                create(failover=True)
    finally:
        drop()


def test_the_health_check_with_standbys_says_whether_a_promotion_keeps_the_slot(
    publisher: PgCluster, publisher_conn_id: str
) -> None:
    """Against the publisher alone (no standby here: tests/pipeline/test_failover.py has one):
    before 17, failover slots need 17; from 17, a server that is no standby, and a primary
    that holds no consumer back, are named."""
    CreateReplicationSlotOperator(
        task_id="c", slot_name="ops_fo_check", postgres_conn_id=publisher_conn_id
    ).execute(context())
    ti = FakeTI()
    try:
        with pytest.raises(Exception, match="slot health check failed"):
            SlotHealthCheckOperator(
                task_id="h", slot_name="ops_fo_check", postgres_conn_id=publisher_conn_id,
                standby_conn_ids=[publisher_conn_id],
            ).execute(context(ti))  # fmt: skip
        verdict = ti.pushed["return_value"]["failover"]
        assert verdict["ready"] is False
        text = " ".join(verdict["problems"])
        if int(publisher.execute("SHOW server_version_num")[0][0]) < 170000:
            assert "failover slots need PostgreSQL 17" in text
        else:
            assert "is not a standby" in text and "synchronized_standby_slots is empty" in text
    finally:
        DropReplicationSlotOperator(
            task_id="d", slot_name="ops_fo_check", postgres_conn_id=publisher_conn_id
        ).execute(context())


def test_an_active_slot_let_go_within_the_grace_is_healthy(
    publisher: PgCluster, publisher_conn_id: str, pg_tool: Callable[[str], Path]
) -> None:
    """A session that holds the slot for a moment (a trigger's peek) is not its consumer; one
    that keeps holding it is."""
    hook = PgLogicalReplicationHook(postgres_conn_id=publisher_conn_id)
    hook.create_logical_slot("ops_grace")

    def reading() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(pg_tool("pg_recvlogical")), "-h", publisher.host, "-p", str(publisher.port),
             "-U", publisher.superuser, "-d", "postgres", "--slot", "ops_grace", "--start",
             "--no-loop", "-o", "proto_version=1", "-o", "publication_names=none_yet",
             "-f", os.devnull],
            env={**os.environ, "PGPASSWORD": publisher.password},
        )  # fmt: skip
        wait_until(lambda: hook.get_slot("ops_grace").active, what="ops_grace active")
        return proc

    def check(grace: float) -> dict[str, Any]:
        return SlotHealthCheckOperator(  # type: ignore[no-any-return]
            task_id="h", slot_name="ops_grace", postgres_conn_id=publisher_conn_id,
            allow_active=False, active_grace_seconds=grace,
        ).execute(context())  # fmt: skip

    try:
        brief = reading()
        threading.Timer(1.0, brief.terminate).start()
        assert check(30)["problems"] == []  # (let go after a second)
        brief.wait(timeout=30)
        wait_until(lambda: not hook.get_slot("ops_grace").active, what="ops_grace let go")
        staying = reading()
        try:
            with pytest.raises(Exception, match="is active in another session"):
                check(0.5)
        finally:
            staying.terminate()
            staying.wait(timeout=30)
    finally:
        wait_until(lambda: not hook.get_slot("ops_grace").active, what="ops_grace let go")
        hook.drop_slot("ops_grace")
