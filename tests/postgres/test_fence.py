"""The write fence's statements on a live server, with a role, a database and tables of hostile
names: the tables a fence covers, the revoke that reports exactly what it took, what would still
let a role write, the state kept in a role setting and the grants that give back what was taken,
the sessions that could still commit, and the message whose commit marks the fence's LSN."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql
from psycopg.rows import dict_row

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.fence import FENCE_STATE_SETTING, FenceGrant, RoleFence
from airflow_pglogrepl.postgres import fence
from airflow_pglogrepl.postgres.connect import run_ddl
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster

pytestmark = pytest.mark.pgversion  # pg_terminate_backend's timeout and the message signature
_runs = itertools.count(1)
ORDERS = TableRef('Sch"; ema', "Or'ders")
MONTHS, JAN = TableRef("public", "by month"), TableRef("public", "jan")
PARENT, CHILD = TableRef("public", "parent"), TableRef("public", "child")


@pytest.fixture
def setup(publisher: PgCluster) -> Iterator[tuple[Any, str, str]]:
    """A session as the superuser on a database of its own, and a role that may write."""
    run = next(_runs)
    db, role = f"pg_fence {run}; '\"", f'app "{run}"; x'
    publisher.create_database(db)
    with publisher.connect(db, row_factory=dict_row) as conn:
        ident = sql.Identifier(role)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(ident))
        conn.execute('CREATE SCHEMA "Sch""; ema"')
        conn.execute('CREATE TABLE "Sch""; ema"."Or\'ders" (id int)')
        conn.execute('CREATE TABLE "by month" (id int, at date) PARTITION BY RANGE (at)')
        conn.execute(
            "CREATE TABLE jan PARTITION OF \"by month\" FOR VALUES FROM ('2026-01-01')"
            " TO ('2026-02-01')"
        )
        conn.execute("CREATE TABLE parent (id int)")
        conn.execute("CREATE TABLE child () INHERITS (parent)")
        conn.execute(
            sql.SQL(
                'GRANT INSERT, UPDATE ON "Sch""; ema"."Or\'ders" TO {} WITH GRANT OPTION'
            ).format(ident)
        )
        conn.execute(sql.SQL("GRANT DELETE, SELECT ON child TO {}").format(ident))
        yield conn, db, role
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                     (role,))  # fmt: skip


def test_the_tables_a_fence_covers(setup: tuple[Any, str, str]) -> None:
    conn, _, _ = setup
    assert set(fence.fence_relations(conn, [ORDERS]).values()) == {ORDERS}
    # a partition's parent, and a parent's partitions; an inheritance child's parent
    assert set(fence.fence_relations(conn, [JAN]).values()) == {JAN, MONTHS}
    assert set(fence.fence_relations(conn, [MONTHS]).values()) == {JAN, MONTHS}
    assert set(fence.fence_relations(conn, [CHILD]).values()) == {CHILD, PARENT}
    with pytest.raises(ObjectNotFoundError, match="absent"):
        fence.fence_relations(conn, [ORDERS, TableRef("public", "absent")])
    with pytest.raises(ValueError, match="at least one table"):
        fence.fence_relations(conn, [])
    with pytest.raises(ObjectNotFoundError, match="nobody"):
        fence.role_oids(conn, ["nobody"])


def test_revoke_reports_what_it_took_and_a_grant_gives_it_back(
    setup: tuple[Any, str, str],
) -> None:
    conn, _, role = setup
    oid = fence.role_oids(conn, [role])[role]
    relations = fence.fence_relations(conn, [ORDERS, CHILD])
    taken = fence.revoke(conn, role, oid, relations)
    assert sorted(taken) == sorted([
        FenceGrant(ORDERS, "INSERT", True),
        FenceGrant(ORDERS, "UPDATE", True),
        FenceGrant(CHILD, "DELETE", False),
    ])  # fmt: skip
    assert fence.direct_grants(conn, oid, relations) == {}  # SELECT is no write: kept
    assert fence.revoke(conn, role, oid, relations) == []  # nothing left to take
    assert fence.leaks(conn, [oid], list(relations)) == []

    conn.execute("GRANT TRUNCATE ON child TO PUBLIC")  # a path the revoke cannot close
    (leak,) = fence.leaks(conn, [oid], list(relations))
    assert "TRUNCATE" in leak and "PUBLIC" in leak and role in leak

    for table, grantable in ((ORDERS, True), (CHILD, False)):
        privileges = [g.privilege for g in taken if g.table == table]
        run_ddl(conn, fence.grant_statement(table, privileges, role, grantable))
    assert fence.direct_grants(conn, oid, relations) == {
        (ORDERS, "INSERT"): True, (ORDERS, "UPDATE"): True, (CHILD, "DELETE"): False
    }  # fmt: skip
    assert fence.existing_tables(conn, [ORDERS, TableRef("public", "gone")]) == {ORDERS}


def test_the_state_kept_in_a_role_setting(setup: tuple[Any, str, str]) -> None:
    conn, db, role = setup
    assert fence.current_database(conn) == db and fence.fence_states(conn) == {}
    state = RoleFence(role, True, "off", (FenceGrant(ORDERS, "INSERT", True),))
    run_ddl(conn, fence.set_role_statement(role, db, FENCE_STATE_SETTING,
                                           sql.Literal(state.to_json())))  # fmt: skip
    run_ddl(conn, fence.set_role_statement(role, db, "default_transaction_read_only",
                                           sql.SQL("on")))  # fmt: skip
    assert fence.fence_states(conn) == {role: state}
    assert fence.role_setting(conn, role, "default_transaction_read_only") == "on"
    run_ddl(conn, fence.set_role_statement(role, db, FENCE_STATE_SETTING, sql.SQL("DEFAULT")))
    assert fence.fence_states(conn) == {}


def test_sessions_that_could_still_write_are_found_and_ended(
    setup: tuple[Any, str, str], publisher: PgCluster
) -> None:
    conn, db, role = setup
    conn.execute(sql.SQL("GRANT INSERT ON child TO {}").format(sql.Identifier(role)))
    app = publisher.connect(db, user=role, password="pw", autocommit=False)
    try:
        app.execute("INSERT INTO child VALUES (1)")  # an open transaction that wrote
        pid = app.info.backend_pid
        later = fence.clock_timestamp(conn) + dt.timedelta(seconds=1)
        found = fence.sessions_that_could_write(conn, [role], fenced_at=later, sessions=False)
        assert [(b.pid, b.role) for b in found] == [(pid, role)]
        earlier = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        assert fence.sessions_that_could_write(conn, [role], fenced_at=earlier, sessions=True) == []
        assert fence.terminate_backends(conn, [pid], 5.0) == [pid]
    finally:
        app.close()
    assert conn.execute("SELECT count(*) AS n FROM child").fetchone()["n"] == 0  # rolled back


def test_the_fence_message_commits_before_the_position_read(setup: tuple[Any, str, str]) -> None:
    conn, _, _ = setup
    conn.execute("SELECT pg_create_logical_replication_slot('pg_fence_msg', 'test_decoding')")
    try:
        before = fence.wal_position(conn)
        with conn.transaction():
            fence.emit_fence_message(conn, {"fence": "x'; y"})
        after = fence.wal_position(conn)
        assert after > before
        changes = conn.execute(
            "SELECT lsn, data FROM pg_logical_slot_peek_changes('pg_fence_msg', NULL, NULL)"
        ).fetchall()
        (message,) = [c for c in changes if "pglogrepl.fence" in c["data"]]
        assert "x'; y" in message["data"] and LSN(str(message["lsn"])) < after
    finally:
        conn.execute("SELECT pg_drop_replication_slot('pg_fence_msg')")
