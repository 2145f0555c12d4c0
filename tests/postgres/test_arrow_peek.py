"""A slot's changes as Arrow batches through ADBC: a bad slot name refused before anything is
opened, the messages psycopg's peek gives split over as many batches as the size hint asks,
the slot left where it was, and an ADBC failure handed back redacted, for the psycopg path."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import ArrowPeekError, InvalidSlotNameError
from airflow_pglogrepl.postgres.arrow_peek import peek_arrow
from airflow_pglogrepl.postgres.source import PgSource
from tests.support.databases import Database

OPTIONS = {"proto_version": "1", "publication_names": "pub"}


def test_a_bad_slot_name_is_refused_before_anything_is_opened() -> None:
    params = {"host": "/no/such/socket/dir", "user": "u", "dbname": "d"}
    with pytest.raises(InvalidSlotNameError):
        next(peek_arrow(params, 'slot"; --', label="L", upto_lsn="0/0", options=OPTIONS))


def test_the_messages_in_batches_of_the_size_asked_and_the_slot_not_moved(
    database: Database, slot_name: str
) -> None:
    database.sql(
        "CREATE TABLE t (id int PRIMARY KEY, pad text); CREATE PUBLICATION pub FOR TABLE t"
    )
    source = PgSource(database.cluster.dsn(database.name))
    database.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot_name,))
    database.sql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 300) g")
    end = source.flush_lsn()
    expected = [bytes(d) for _, _, d in source.peek_changes(slot_name, upto_lsn=end,
                                                            options=OPTIONS)]  # fmt: skip
    batches = list(peek_arrow(source.connection_params(), slot_name, label="L", upto_lsn=end,
                              options=OPTIONS, batch_bytes=4096))  # fmt: skip
    assert len(batches) > 1
    assert [m for batch in batches for m in batch.to_pylist()] == expected
    slot = source.get_slot(slot_name)
    assert slot.confirmed_flush_lsn < end  # peeked, not consumed
    source.drop_slot(slot_name)


def test_a_failure_is_handed_back_redacted_for_the_psycopg_path(database: Database) -> None:
    params = {**database.cluster.params(database.name), "password": "wr0ng-pw"}
    with pytest.raises(ArrowPeekError) as caught:
        next(peek_arrow(params, "any_slot", label="SRC", upto_lsn="0/0", options=OPTIONS))
    assert caught.value.retryable
    assert "SRC: peeking slot 'any_slot' through ADBC failed" in str(caught.value)
    assert "wr0ng-pw" not in str(caught.value)
