"""The write fence's guard on a live server: the fenced roles with every member of theirs, the
trigger that refuses their writes (``SET ROLE`` too) and lets others through, the tables it is
on, its removal with its schema, a guard schema another role owns refused, and the sessions
whose writes the guard's installation waits for."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from airflow_pglogrepl.postgres.fence_guard import (
    GuardHijackedError,
    fenced_members,
    guarded_tables,
    install_guard,
    lock_holders,
    remove_guard,
)
from tests.support.databases import Database

_runs = itertools.count(1)


@pytest.fixture
def conn(database: Database) -> Iterator[tuple[Any, list[str]]]:
    """A superuser's session on a database with a table, and roles app > member > nested."""
    run = next(_runs)
    roles = [f'app "{run}"', f"member {run}", f"nested {run}"]
    with database.cluster.connect(database.name, row_factory=dict_row) as c:
        app, member, nested = (sql.Identifier(r) for r in roles)
        for ident in (app, member, nested):
            c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(ident))
        c.execute(sql.SQL("GRANT {} TO {}").format(app, member))
        c.execute(sql.SQL("GRANT {} TO {}").format(member, nested))
        c.execute("CREATE TABLE t (id int)")
        c.execute(sql.SQL("GRANT INSERT, SELECT ON t TO {}").format(app))
        yield c, roles


def test_the_fenced_roles_and_every_member_of_theirs(conn: tuple[Any, list[str]]) -> None:
    c, roles = conn
    assert fenced_members(c, roles[:1]) == sorted(roles)
    assert fenced_members(c, roles[2:]) == roles[2:]
    assert fenced_members(c, ["no such role"]) == []


def test_the_guard_refuses_fenced_writes_and_goes_with_its_schema(
    conn: tuple[Any, list[str]],
) -> None:
    c, roles = conn
    c.execute("BEGIN")
    install_guard(c, [("public", "t")], fenced_members(c, roles[:1]), 5_000)
    c.execute("COMMIT")
    assert guarded_tables(c) == [("public", "t")]
    c.execute("INSERT INTO t VALUES (1)")  # the superuser is not fenced
    for how in ("SET ROLE {}", "SET SESSION AUTHORIZATION {}"):
        c.execute(sql.SQL(how).format(sql.Identifier(roles[2])))
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match=r"write fence: public\.t"):
            c.execute("INSERT INTO t VALUES (2)")
        c.execute("RESET SESSION AUTHORIZATION")
    c.execute("BEGIN")
    assert remove_guard(c) == ["public.t"]
    c.execute("COMMIT")
    assert guarded_tables(c) == []
    assert c.execute("SELECT to_regnamespace('pglogrepl') AS n").fetchone() == {"n": None}
    c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(roles[2])))
    c.execute("INSERT INTO t VALUES (3)")  # released


def test_a_guard_schema_another_role_owns_is_refused(conn: tuple[Any, list[str]]) -> None:
    c, roles = conn
    c.execute(sql.SQL("CREATE SCHEMA pglogrepl AUTHORIZATION {}").format(sql.Identifier(roles[0])))
    c.execute("BEGIN")
    with pytest.raises(GuardHijackedError, match=r"belongs to role app .*Fix: drop or rename"):
        install_guard(c, [("public", "t")], roles, 5_000)
    c.execute("ROLLBACK")
    assert guarded_tables(c) == []


def test_the_sessions_holding_writes_are_named_and_the_guard_gives_up_in_time(
    conn: tuple[Any, list[str]], database: Database
) -> None:
    c, roles = conn
    relid = c.execute("SELECT 't'::regclass::oid AS r").fetchone()["r"]
    with database.cluster.connect(database.name) as writer:
        writer.execute("BEGIN")
        writer.execute("INSERT INTO t VALUES (1)")
        (holder,) = lock_holders(c, [relid])
        assert holder["pid"] == writer.info.backend_pid and holder["relation"] == "t"
        assert holder["gid"] is None
        c.execute("BEGIN")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            install_guard(c, [("public", "t")], roles, 100)
        c.execute("ROLLBACK")
        writer.execute("ROLLBACK")
    assert lock_holders(c, [relid]) == []
