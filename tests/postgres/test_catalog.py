"""The preflight's catalog statements on a live server: tables of hostile names read in one
batch (key columns only, leaf partitions, privileges), capacity taken on each side, and the
replica-identity statement that waits only ``lock_timeout`` for its lock."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.postgres import catalog
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster

pytestmark = pytest.mark.pgversion  # pg_stat_subscription and pg_index change between majors
_dbs = itertools.count(1)
T = TableRef('Sch"; ema', "T a'b")
PARENT = TableRef("public", "by month")


@pytest.fixture
def db(publisher: PgCluster) -> str:
    name = f"pg_catalog_{next(_dbs)}"
    publisher.create_database(name)
    return name


@pytest.fixture
def conn(publisher: PgCluster, db: str) -> Iterator[Any]:
    with publisher.connect(db, row_factory=dict_row) as c:
        c.execute('CREATE SCHEMA "Sch""; ema"')
        c.execute(
            'CREATE TABLE "Sch""; ema"."T a\'b" (id int NOT NULL, "co""de" text, extra text,'
            ' CONSTRAINT "p k" PRIMARY KEY (id) INCLUDE (extra))'
        )
        c.execute('CREATE UNIQUE INDEX "by code" ON "Sch""; ema"."T a\'b" ("co""de")')
        c.execute('CREATE UNIQUE INDEX lower_code ON "Sch""; ema"."T a\'b" (lower("co""de"))')
        c.execute('CREATE TABLE "by month" (id int, at date) PARTITION BY RANGE (at)')
        c.execute(
            'CREATE TABLE "m\'01" PARTITION OF "by month" FOR VALUES FROM (\'2026-01-01\') '
            "TO ('2026-02-01')"
        )
        yield c


def test_tables_in_one_batch_with_their_key_columns_and_leaf_partitions(conn: Any) -> None:
    facts = catalog.table_facts(conn, [T, PARENT, TableRef("public", "absent")])
    assert set(facts) == {T, PARENT}
    table = facts[T]
    assert (table.relkind, table.replica_identity, table.can_select) == ("r", "d", True)
    assert [c.name for c in table.columns] == ["id", 'co"de', "extra"]
    indexes = {ix.name: ix for ix in table.indexes}
    assert indexes["p k"].columns == ("id",) and indexes["p k"].primary  # INCLUDE left out
    assert indexes["by code"].nullable_columns == ('co"de',)
    assert indexes["lower_code"].expression and not indexes["lower_code"].primary
    assert facts[PARENT].relkind == "p"
    assert facts[PARENT].leaf_partitions == (TableRef("public", "m'01"),)
    assert catalog.table_facts(conn, []) == {}


def test_the_connecting_role_and_the_capacity_taken(conn: Any, publisher: PgCluster) -> None:
    role = catalog.role_facts(conn)
    assert role.superuser and role.can_login
    before = catalog.publisher_usage(conn)
    conn.execute("SELECT pg_create_logical_replication_slot('pg_catalog_usage', 'pgoutput')")
    try:
        assert catalog.publisher_usage(conn).slots_in_use == before.slots_in_use + 1
    finally:
        conn.execute("SELECT pg_drop_replication_slot('pg_catalog_usage')")
    subs = catalog.subscriber_usage(conn)
    conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
    create = psycopg.sql.SQL(
        "CREATE SUBSCRIPTION s CONNECTION {} PUBLICATION p"
        " WITH (connect = false, enabled = false, slot_name = NONE)"
    )
    conn.execute(create.format(publisher.dsn("postgres")))
    try:
        now = catalog.subscriber_usage(conn)
        assert now.subscriptions == subs.subscriptions + 1
        assert now.enabled_subscriptions == subs.enabled_subscriptions
    finally:
        conn.execute("DROP SUBSCRIPTION s")


def test_replica_identity_statements_and_their_lock_timeout(
    conn: Any, publisher: PgCluster, db: str
) -> None:
    conn.execute('ALTER TABLE "Sch""; ema"."T a\'b" ALTER COLUMN "co""de" SET NOT NULL')
    statement = catalog.replica_identity_statement(T, "index", "by code")
    assert statement.as_string(conn) == (
        'ALTER TABLE "Sch""; ema"."T a\'b" REPLICA IDENTITY USING INDEX "by code"'
    )
    catalog.set_replica_identity(conn, statement, "5s")
    assert catalog.table_facts(conn, [T])[T].replica_identity == "i"
    for mode, index in (("index", None), ("DEFAULT; DROP TABLE x", None), ("full", "by code")):
        with pytest.raises(ValueError, match="T a'b"):
            catalog.replica_identity_statement(T, mode, index)

    full = catalog.replica_identity_statement(T, "full", None)
    with publisher.connect(db) as holder:
        holder.execute("BEGIN")
        holder.execute('LOCK TABLE "Sch""; ema"."T a\'b" IN ACCESS SHARE MODE')
        with pytest.raises(psycopg.errors.LockNotAvailable):
            catalog.set_replica_identity(conn, full, "50ms")
        holder.execute("ROLLBACK")
    assert catalog.table_facts(conn, [T])[T].replica_identity == "i"  # nothing changed
    catalog.set_replica_identity(conn, full, "5s")
    assert catalog.table_facts(conn, [T])[T].replica_identity == "f"
