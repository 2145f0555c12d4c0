"""The server's statements on a live server: its settings in bytes and seconds whatever unit
pg_settings gives, one identity for two sessions of one instance, and a slot's decoding
statistics."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.postgres import server, slots
from airflow_pglogrepl.testing.pgcluster import PgCluster

pytestmark = pytest.mark.pgversion  # settings and statistics views change between majors
_dbs = itertools.count(1)


@pytest.fixture
def conn(publisher: PgCluster) -> Iterator[Any]:
    db = f"pg_server_{next(_dbs)}"
    publisher.create_database(db)
    with publisher.connect(db, row_factory=dict_row) as c:
        yield c


def test_settings_in_bytes_whatever_their_unit(conn: Any) -> None:
    facts = server.server_facts(conn)
    shown = conn.execute(
        "SELECT setting::int8 AS v, unit FROM pg_settings WHERE name = 'logical_decoding_work_mem'"
    ).fetchone()
    assert shown["unit"] == "kB" and facts.logical_decoding_work_mem == shown["v"] * 1024
    assert facts.wal_level == "logical" and not facts.in_recovery
    assert facts.version_num // 10000 == int(facts.version.split(".")[0])
    assert facts.temp_file_limit is None  # -1: no limit


def test_one_identity_for_two_sessions_of_one_instance(conn: Any, publisher: PgCluster) -> None:
    with publisher.connect("postgres", row_factory=dict_row) as other:
        assert server.instance_identity(conn) == server.instance_identity(other)
    assert server.instance_identity(conn)[1] == str(publisher.port)


def test_a_slots_decoding_statistics(conn: Any) -> None:
    conn.execute("CREATE TABLE t (id int)")
    conn.execute("SELECT pg_create_logical_replication_slot('pg_server_spill', 'test_decoding')")
    try:
        assert slots.slot_spill(conn, "no such slot") is None
        before = slots.slot_spill(conn, "pg_server_spill")
        assert before is None or before.total_txns == 0  # nothing decoded yet
        conn.execute("INSERT INTO t SELECT generate_series(1, 10)")
        conn.execute(
            "SELECT count(*) FROM pg_logical_slot_get_changes('pg_server_spill', NULL, NULL)"
        )
        conn.execute("SELECT pg_stat_force_next_flush()")
        spill = slots.slot_spill(conn, "pg_server_spill")
        assert spill is not None and spill.total_txns >= 1 and spill.spill_txns == 0
    finally:
        conn.execute("SELECT pg_drop_replication_slot('pg_server_spill')")


def test_a_slot_found_on_an_async_connection(conn: Any, publisher: PgCluster) -> None:
    """What a trigger reads, without blocking its event loop: the slot, or None when absent."""
    import asyncio

    import psycopg

    from airflow_pglogrepl.conninfo import make_dsn
    from airflow_pglogrepl.postgres.lsn_adapters import register_lsn_adapters

    async def find(name: str) -> Any:
        dsn = make_dsn(publisher.params("postgres"))
        async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as aconn:
            register_lsn_adapters(aconn)
            return await slots.find_slot(aconn, name)

    conn.execute("SELECT pg_create_logical_replication_slot('pg_server_async', 'pgoutput')")
    try:
        found = asyncio.run(find("pg_server_async"))
        assert found is not None and found.name == "pg_server_async" and found.plugin == "pgoutput"
        assert asyncio.run(find("pg_server_absent")) is None
    finally:
        conn.execute("SELECT pg_drop_replication_slot('pg_server_async')")
