"""The sequence statements of a cutover on a live server: the sequences behind identity and
serial columns (hostile names too), their state before and after first use, and setval."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.postgres import sequences
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster

_dbs = itertools.count(1)
SCHEMA = 'Sch"; ema'
TABLE = TableRef(SCHEMA, "Ta ble")


@pytest.fixture
def conn(publisher: PgCluster) -> Iterator[Any]:
    """A session on a database of its own, with a table fed by an identity and a serial."""
    db = f"pg_sequences_{next(_dbs)}"
    publisher.create_database(db)
    with publisher.connect(db, row_factory=dict_row) as c:
        c.execute('CREATE SCHEMA "Sch""; ema"')
        c.execute(
            'CREATE TABLE "Sch""; ema"."Ta ble" (id bigint GENERATED ALWAYS AS IDENTITY,'
            " n serial, v text)"
        )
        yield c


def test_the_sequences_behind_identity_and_serial_columns(conn: Any) -> None:
    owned = sequences.owned_sequences(conn, [TABLE, TableRef("public", "absent")])
    assert [(o.table, o.column, o.kind) for o in owned] == [
        (TABLE, "id", "identity"),
        (TABLE, "n", "serial"),
    ]
    assert all(o.sequence.schema == SCHEMA for o in owned)
    assert sequences.owned_sequences(conn, []) == []


def test_a_sequence_never_used_reads_no_value_and_setval_moves_it(conn: Any) -> None:
    identity = sequences.owned_sequences(conn, [TABLE])[0].sequence
    state = sequences.sequence_states(conn, [identity])[identity]
    assert state.last_value is None and state.readable and state.increment == 1
    assert sequences.column_max(conn, TABLE, "id") is None  # an empty table
    conn.execute('INSERT INTO "Sch""; ema"."Ta ble" (v) VALUES (%s), (%s)', ("a", "b"))
    assert sequences.column_max(conn, TABLE, "id") == 2
    assert sequences.set_sequence(conn, identity, 1000) is True
    conn.execute('INSERT INTO "Sch""; ema"."Ta ble" (v) VALUES (%s)', ("c",))
    assert sequences.column_max(conn, TABLE, "id") == 1001  # the next value after setval's
    assert sequences.sequence_states(conn, [identity])[identity].last_value == 1001


def test_a_sequence_that_does_not_exist(conn: Any) -> None:
    absent = TableRef(SCHEMA, "no_such_seq")
    assert sequences.set_sequence(conn, absent, 5) is False
    assert sequences.sequence_states(conn, [absent]) == {}
