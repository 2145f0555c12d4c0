"""The parity statements on a live server: replicated columns only, and a checksum that reads
the same rows the same way whatever the session's settings and the columns' order."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.postgres import parity
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster

_dbs = itertools.count(1)
A, B = TableRef("public", "a"), TableRef("public", "b")


@pytest.fixture
def conn(publisher: PgCluster) -> Iterator[Any]:
    db = f"pg_parity_{next(_dbs)}"
    publisher.create_database(db)
    with publisher.connect(db, row_factory=dict_row) as c:
        yield c


def test_only_replicated_columns_in_column_order(conn: Any) -> None:
    conn.execute(
        "CREATE TABLE a (id int, gone text, v text, g int GENERATED ALWAYS AS (id * 2) STORED)"
    )
    conn.execute("ALTER TABLE a DROP COLUMN gone")
    conn.execute("CREATE VIEW not_a_table AS SELECT 1 AS x")
    found = parity.table_columns(conn, [A, TableRef("public", "not_a_table"), B])
    assert found == {A: ("id", "v")}


def test_equal_rows_give_equal_checksums_whatever_the_settings_and_column_order(
    conn: Any,
) -> None:
    conn.execute("CREATE TABLE a (id int, t timestamptz, d date, f float8, m money, i interval)")
    conn.execute("CREATE TABLE b (i interval, m money, f float8, d date, t timestamptz, id int)")
    row = ("2026-11-26 03:00:00+00", "2026-11-26", 0.1, 12.5, "1 day 2 hours")
    values = "(1, %s, %s, %s, %s::numeric::money, %s)"
    conn.execute(f"INSERT INTO a VALUES {values}, {values}", row * 2)
    conn.execute("SET TimeZone = 'Asia/Kolkata'")  # changes timestamptz's text
    conn.execute("SET DateStyle = 'SQL, DMY'")  # and a date's
    columns = ("id", "t", "d", "f", "m", "i")
    first = parity.table_checksum(conn, A, columns)
    conn.execute("INSERT INTO b SELECT i, m, f, d, t, id FROM a")
    conn.execute("SET TimeZone = 'America/Los_Angeles'")
    conn.execute("SET IntervalStyle = 'iso_8601'")
    assert parity.table_checksum(conn, B, columns) == first
    assert first.rows == 2 and first.checksum != 0  # two equal rows add up, not cancel out
    conn.execute("UPDATE b SET f = 0.1000001")
    assert parity.table_checksum(conn, B, columns) != first
