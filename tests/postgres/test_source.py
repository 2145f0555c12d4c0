"""``PgSource``, the Spark applications' source without Airflow: a slot's whole life through it
(created with a snapshot, peeked by psycopg and by ADBC alike without moving, advanced, dropped),
its writer lock, and its label, never the DSN, naming it in errors."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.conninfo import make_dsn
from airflow_pglogrepl.exceptions import (
    ConnectionFailedError,
    LakeWriterBusyError,
    SlotNotFoundError,
)
from airflow_pglogrepl.postgres.source import DSN_ENV, PgSource
from airflow_pglogrepl.tables import TableRef
from tests.support.databases import Database

OPTIONS = {"proto_version": "1", "publication_names": "pub"}


def test_the_parameters_are_the_dsn_s_and_given_as_a_copy() -> None:
    source = PgSource("host=h user=u password=pw dbname=d")
    params = source.connection_params()
    assert (params["host"], params["password"], source.label) == ("h", "pw", DSN_ENV)
    params["password"] = "changed"
    assert source.connection_params()["password"] == "pw"


def test_a_slot_s_life_through_the_source(database: Database, slot_name: str) -> None:
    database.sql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    source = PgSource(database.cluster.dsn(database.name), label="SRC")
    assert source.missing_publications(["pub", "gone"]) == ["gone"]
    assert source.source_identity()["database"] == database.name
    with source.create_slot_with_snapshot(slot_name) as exported:
        start = exported.consistent_point
    database.sql("INSERT INTO t VALUES (1), (2)")
    end = source.flush_lsn()
    rows = [bytes(data) for _, _, data in source.peek_changes(slot_name, upto_lsn=end,
                                                              options=OPTIONS)]  # fmt: skip
    assert len(rows) == 5  # begin, relation, two inserts, commit
    arrow = [m for batch in source.peek_arrow(slot_name, upto_lsn=end, options=OPTIONS)
             for m in batch.to_pylist()]  # fmt: skip
    assert arrow == rows
    assert source.get_slot(slot_name, plugin="pgoutput").confirmed_flush_lsn == start
    assert source.advance_slot(slot_name, end) == end
    origins = source.column_origins(TableRef("public", "t"), ["id", "gone"])
    assert origins.columns["id"].exists and not origins.columns["gone"].exists
    with source.writer_lock(slot_name) as lock:
        lock.check()
        with pytest.raises(LakeWriterBusyError), source.writer_lock(slot_name):
            pass
    assert source.drop_slot(slot_name) is True
    assert source.drop_slot(slot_name, missing_ok=True) is False
    with pytest.raises(SlotNotFoundError):
        source.get_slot(slot_name)


def test_errors_name_the_label_and_never_the_password(database: Database) -> None:
    wrong = make_dsn({**database.cluster.params(database.name), "password": "wr0ng-pw"})
    source = PgSource(wrong, label="PGLOGREPL_SOURCE_DSN of the drain")
    with pytest.raises(ConnectionFailedError) as caught:
        source.flush_lsn()
    assert "(PGLOGREPL_SOURCE_DSN of the drain)" in str(caught.value)
    assert "wr0ng-pw" not in str(caught.value)


@pytest.mark.pgversion
def test_a_slot_created_with_a_snapshot_is_a_failover_slot_where_the_server_can_keep_one(
    database: Database, slot_name: str
) -> None:
    """What ``snapshot_app --failover`` asks of it. Before, the source took no ``failover``,
    and every standalone snapshot failed with a TypeError."""
    source = PgSource(database.cluster.dsn(database.name), label="SRC")
    can = int(database.sql("SHOW server_version_num")[0][0]) >= 170000
    with source.create_slot_with_snapshot(slot_name, failover=None) as exported:
        assert exported.failover is can
    (failover,) = database.sql(
        "SELECT coalesce(to_jsonb(s)->>'failover', 'false') FROM pg_replication_slots s"
        " WHERE slot_name = %s", (slot_name,))[0]  # fmt: skip
    assert (failover == "true") is can
    assert source.drop_slot(slot_name)
