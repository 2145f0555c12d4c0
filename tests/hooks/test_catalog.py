"""The catalog reads through the hook, and the one change it makes: ``set_replica_identity``'s
refusals (a lock held past ``lock_timeout``, a role that does not own the table, an index that
cannot serve) each become ``ReplicaIdentityChangeError`` with the statement, the server's reason
and the fix; only the lock is worth a retry."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from psycopg import sql

from airflow_pglogrepl.exceptions import ReplicaIdentityChangeError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.tables import TableRef
from tests.support.airflow import set_airflow_connection
from tests.support.databases import Database

T = TableRef('Sch"; ema', "T a'b")
ALTER = 'ALTER TABLE "Sch""; ema"."T a\'b" REPLICA IDENTITY'


@pytest.fixture
def table(database: Database) -> Database:
    database.sql(
        'CREATE SCHEMA "Sch""; ema";'
        'CREATE TABLE "Sch""; ema"."T a\'b" (id int PRIMARY KEY, code text, note text);'
        'CREATE UNIQUE INDEX "on note" ON "Sch""; ema"."T a\'b" (note)'  # note is nullable
    )
    return database


def test_nothing_asked_opens_no_session() -> None:
    hook = PgLogicalReplicationHook(postgres_conn_id="catalog_no_such_connection")
    assert hook.table_facts([]) == {}  # the connection is not even looked up


def test_a_change_is_made_and_logged_and_read_back(
    table: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = table.hook
    assert hook.table_facts([T])[T].replica_identity == "d"
    hook.set_replica_identity(T, "full")
    assert f"Replica identity changed: {ALTER} FULL" in capsys.readouterr().out
    with hook.session() as conn:  # a caller's session: the reads use it
        assert hook.table_facts([T], conn=conn)[T].replica_identity == "f"
        assert hook.role_facts(conn=conn).superuser


def test_a_lock_held_past_lock_timeout_is_refused_as_worth_a_retry(table: Database) -> None:
    with table.cluster.connect(table.name) as holder:
        holder.execute("BEGIN")
        holder.execute('LOCK TABLE "Sch""; ema"."T a\'b" IN ACCESS SHARE MODE')
        with pytest.raises(ReplicaIdentityChangeError) as caught:
            table.hook.set_replica_identity(T, "full", lock_timeout="50ms")
        holder.execute("ROLLBACK")
    error = caught.value
    assert error.retryable and error.table == T and error.statement == f"{ALTER} FULL"
    assert "locked by other sessions for lock_timeout (50ms)" in str(error)
    assert "Fix: retry when no long transaction holds it" in str(error)
    assert table.hook.table_facts([T])[T].replica_identity == "d"  # nothing changed


def test_an_index_that_cannot_serve_is_refused_with_the_server_s_reason(table: Database) -> None:
    for index, reason in (("on note", "nullable"), ("no such index", "does not exist")):
        with pytest.raises(ReplicaIdentityChangeError, match=reason) as caught:
            table.hook.set_replica_identity(T, "index", index)
        assert not caught.value.retryable
        assert "Fix: inspect the table and its indexes again" in str(caught.value)


def test_a_role_that_does_not_own_the_table_is_told_who_may(table: Database) -> None:
    role = f"not owner {table.name[-12:]}"
    table.sql(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(sql.Identifier(role)))
    table.sql(sql.SQL('GRANT USAGE ON SCHEMA "Sch""; ema" TO {}').format(sql.Identifier(role)))
    cluster = table.cluster
    set_airflow_connection(
        "catalog_not_owner",
        f"postgres://{quote(role, safe='')}:pw@{cluster.host}:{cluster.port}/"
        f"{quote(table.name, safe='')}",
    )
    hook = PgLogicalReplicationHook(postgres_conn_id="catalog_not_owner")
    with pytest.raises(ReplicaIdentityChangeError, match="must be owner") as caught:
        hook.set_replica_identity(T, "full")
    assert "Fix: run it as the table's owner or a superuser" in str(caught.value)
    assert not caught.value.retryable
