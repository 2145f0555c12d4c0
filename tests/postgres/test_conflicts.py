"""The apply-error statements on a live server, on a subscription created without connecting
(no worker, no slot): what the subscriber tells of it, a pending SKIP set and withdrawn, its
origin moved, its counters reset; conflict counters from PostgreSQL 18 only."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres import conflicts
from airflow_pglogrepl.postgres.lsn_adapters import register_lsn_adapters
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.versions import Features

pytestmark = pytest.mark.pgversion
_dbs = itertools.count(1)
NAME = 'Sub "x"; y'


@pytest.fixture
def conn(publisher: PgCluster) -> Iterator[Any]:
    db = f"pg_conflicts_{next(_dbs)}"
    publisher.create_database(db)
    with publisher.connect(db, row_factory=dict_row) as c:
        register_lsn_adapters(c)  # as the hook's sessions read pg_lsn
        c.execute(
            'CREATE SUBSCRIPTION "Sub ""x""; y" CONNECTION \'dbname=nowhere\''
            " PUBLICATION p WITH (connect = false)"
        )
        try:
            yield c
        finally:
            c.execute('ALTER SUBSCRIPTION "Sub ""x""; y" SET (slot_name = NONE)')
            c.execute('DROP SUBSCRIPTION "Sub ""x""; y"')


def test_what_the_subscriber_tells_of_a_subscription_without_workers(conn: Any) -> None:
    head = conflicts.error_head(conn, NAME)
    assert head is not None
    assert head["subslotname"] == NAME and head["subpublications"] == ["p"]
    assert head["apply_pid"] is None and head["sync_rels"] == []
    assert head["skip_lsn"] is None
    assert conflicts.error_head(conn, "no such subscription") is None
    counts = conflicts.conflict_counts(conn, head["oid"])
    if Features.of(conn.info.server_version).conflict_counters:
        assert counts and set(counts.values()) == {0} and "insert_exists" in counts
    else:
        assert counts is None


def test_a_skip_set_and_withdrawn_and_the_origin_moved(conn: Any) -> None:
    conflicts.skip(conn, NAME, LSN("0/1234ABC"))
    assert conflicts.error_head(conn, NAME)["skip_lsn"] == LSN("0/1234ABC")  # type: ignore[index]
    conflicts.skip(conn, NAME, None)
    assert conflicts.error_head(conn, NAME)["skip_lsn"] is None  # type: ignore[index]
    oid = conflicts.error_head(conn, NAME)["oid"]  # type: ignore[index]
    assert conflicts.origin_progress(conn, oid) is None  # nothing applied yet
    conflicts.advance_origin(conn, NAME, LSN("0/5000000"))
    assert conflicts.origin_progress(conn, oid) == LSN("0/5000000")
    conflicts.set_enabled(conn, NAME, False)  # a subscription made without connecting is off
    conflicts.reset_error_stats(conn, NAME)
