"""Failover slots against the live publisher (``postgres.failover`` and the ``failover``
argument of slot creation): made one wherever the server can keep one (17+), refused with the
reason where it cannot, and an existing slot made one."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import FailoverSlotUnsupportedError, SlotInUseError
from airflow_pglogrepl.postgres import failover, slots
from airflow_pglogrepl.postgres.connect import Conn, connect
from airflow_pglogrepl.postgres.snapshot import create_slot_with_snapshot
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.testing.wait import wait_until

pytestmark = pytest.mark.pgversion

NAMES = ("fo_auto", "fo_off", "fo_snap", "fo_made")


@pytest.fixture
def conn(publisher: PgCluster) -> Iterator[Conn]:
    with connect(publisher.params(), label="publisher") as c:
        yield c
    for name in NAMES:
        publisher.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                          " WHERE slot_name = %s", (name,))  # fmt: skip


def _failover(publisher: PgCluster, name: str) -> bool:
    rows = publisher.execute("SELECT to_jsonb(s)->>'failover' FROM pg_replication_slots s"
                             " WHERE slot_name = %s", (name,))  # fmt: skip
    return rows[0][0] == "true"


def test_a_slot_is_a_failover_slot_wherever_the_server_can_keep_one(
    publisher: PgCluster, conn: Conn
) -> None:
    can = conn.info.server_version >= 170000
    created = slots.create_logical_slot(conn, "fo_auto", failover=None)
    assert created.failover is can and _failover(publisher, "fo_auto") is can
    assert not slots.create_logical_slot(conn, "fo_off").failover  # (False: as asked)
    assert not _failover(publisher, "fo_off")
    with create_slot_with_snapshot(publisher.params(), "fo_snap", failover=None) as exported:
        assert exported.failover is can
    assert _failover(publisher, "fo_snap") is can
    if can:
        with pytest.raises(FailoverSlotUnsupportedError, match="temporary"):
            slots.create_logical_slot(conn, "fo_temp", temporary=True, failover=True)
    else:
        with pytest.raises(FailoverSlotUnsupportedError, match="need PostgreSQL 17"):
            slots.create_logical_slot(conn, "fo_made", failover=True)
        assert publisher.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'fo_made'"
                                 ) == []  # fmt: skip


def test_an_existing_slot_is_made_a_failover_slot(publisher: PgCluster, conn: Conn) -> None:
    if conn.info.server_version < 170000:
        pytest.skip("failover slots need PostgreSQL 17")
    slots.create_logical_slot(conn, "fo_made")
    assert not _failover(publisher, "fo_made")
    failover.make_failover_slot(publisher.params(), "fo_made", label="publisher")
    assert _failover(publisher, "fo_made")


def test_the_primary_side_of_a_failover(publisher: PgCluster, conn: Conn) -> None:
    """A primary without ``synchronized_standby_slots`` names none; the slot is read whole."""
    slots.create_logical_slot(conn, "fo_auto", failover=None)
    seen = failover.primary_failover(conn, "fo_auto")
    assert seen.slot.name == "fo_auto" and seen.version_num == conn.info.server_version
    assert seen.synchronized_standby_slots == () and seen.standby_slots_active == {}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("setting", "names"),
    [
        ("", ()),
        ("standby_1", ("standby_1",)),
        ("SB1, sb2", ("sb1", "sb2")),  # unquoted: folded, as the server reads it
        ('"SB1",sb2', ("SB1", "sb2")),
        ('"a,b" , c', ("a,b", "c")),
    ],
)
def test_synchronized_standby_slots_is_read_as_the_server_reads_it(
    setting: str, names: tuple[str, ...]
) -> None:
    """Before, ``SB1`` was compared as written, and the check named a slot the server has."""
    assert failover.standby_slot_names(setting) == names


def test_an_existing_slot_a_consumer_holds_is_refused_not_waited_for(
    publisher: PgCluster, conn: Conn, pg_tool: Callable[[str], Path]
) -> None:
    """The server's ALTER_REPLICATION_SLOT waits for the consumer to let go. Before, making a
    slot a failover slot waited as long as a streaming drain ran."""
    if conn.info.server_version < 170000:
        pytest.skip("failover slots need PostgreSQL 17")
    slots.create_logical_slot(conn, "fo_made")
    env = {**os.environ, "PGPASSWORD": publisher.password}
    holder = subprocess.Popen(
        [str(pg_tool("pg_recvlogical")), "-d", publisher.dsn(), "-S", "fo_made", "--start",
         "-o", "proto_version=1", "-o", "publication_names=none", "-f", "-"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        wait_until(lambda: slots.slot_holder(conn, "fo_made") is not None,
                   what="pg_recvlogical holding the slot")  # fmt: skip
        started = time.monotonic()
        with pytest.raises(SlotInUseError):
            failover.make_failover_slot(publisher.params(), "fo_made", label="publisher",
                                        wait_s=2.0)  # fmt: skip
        assert time.monotonic() - started < 30
        assert not _failover(publisher, "fo_made")
    finally:
        holder.terminate()
        holder.wait(timeout=30)
