"""LSN travels both ways through psycopg 3 as PostgreSQL's pg_lsn, in text and binary."""

from __future__ import annotations

import psycopg
import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.lsn_adapters import register_lsn_adapters
from airflow_pglogrepl.testing.pgcluster import PgCluster

VALUES = [LSN(0), LSN("16/B374D848"), LSN("FFFFFFFF/FFFFFFFF"), LSN("0/1")]


@pytest.mark.parametrize("binary", [False, True])
def test_round_trip_through_pg_lsn(publisher: PgCluster, binary: bool) -> None:
    with publisher.connect() as conn:
        register_lsn_adapters(conn)
        with conn.cursor(binary=binary) as cur:
            for value in VALUES:
                cur.execute("SELECT %s AS lsn, pg_typeof(%s)::text AS type, %s::text AS txt",
                            (value, value, value))  # fmt: skip
                lsn, type_name, text = cur.fetchone()  # type: ignore[misc]
                assert type_name == "pg_lsn"
                assert text == str(value)
                assert isinstance(lsn, LSN) and lsn == value


def test_arithmetic_agrees_with_the_server(publisher: PgCluster) -> None:
    a, b = LSN("16/B374D848"), LSN("15/FFFFFF00")
    with publisher.connect() as conn:
        register_lsn_adapters(conn)
        (diff,) = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)::bigint", (a, b)).fetchone()  # type: ignore[misc]
        (later,) = conn.execute("SELECT %s::pg_lsn + 4096::numeric", (b,)).fetchone()  # type: ignore[misc]
    assert diff == a - b
    assert later == b + 4096


def test_without_registration_pg_lsn_stays_text(publisher: PgCluster) -> None:
    with psycopg.connect(**publisher.params(), autocommit=True) as conn:
        (value,) = conn.execute("SELECT '1/2'::pg_lsn").fetchone()  # type: ignore[misc]
    assert value == "1/2"


def test_server_rejects_nothing_we_accept(publisher: PgCluster) -> None:
    """Every text our parser accepts, PostgreSQL reads as the same position."""
    texts = ["0/0", "a/b", "00000001/0000000F", "FFFFFFFF/0"]
    with publisher.connect() as conn:
        for text in texts:
            (value,) = conn.execute("SELECT %s::pg_lsn::text", (text,)).fetchone()  # type: ignore[misc]
            assert LSN(value) == LSN(text)
