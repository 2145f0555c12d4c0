"""The write fence through the hook: a fence that would do nothing or lock its own connection
out refused before anything changes; a fence that would not hold (a PUBLIC grant) rolled back
whole; applied twice without forgetting what it took, and released exactly; the guard put on
the tables, or the sessions named that it waited for in vain."""

from __future__ import annotations

import itertools

import pytest
from psycopg import sql

from airflow_pglogrepl.exceptions import FenceNotHeldError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.models.fence import FenceGrant
from airflow_pglogrepl.tables import TableRef
from tests.support.databases import Database

T = TableRef("public", "t")
_runs = itertools.count(1)


@pytest.fixture
def role(database: Database) -> str:
    name = f'writer "{next(_runs)}"'
    database.sql(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(sql.Identifier(name)))
    database.sql("CREATE TABLE t (id int)")
    database.sql(sql.SQL("GRANT INSERT, DELETE ON t TO {}").format(sql.Identifier(name)))
    return name


def _privileges(database: Database, role: str) -> list[str]:
    rows = database.sql(
        "SELECT privilege_type FROM information_schema.role_table_grants"
        " WHERE grantee = %s AND table_name = 't' ORDER BY 1",
        (role,),
    )
    return [r[0] for r in rows]


def test_a_fence_that_would_do_nothing_or_lock_itself_out_is_refused(database: Database) -> None:
    unreachable = PgLogicalReplicationHook(postgres_conn_id="fence_no_such_connection")
    with pytest.raises(ValueError, match="revoke=True, read_only=True or both"):
        unreachable.apply_write_fence(["r"], [T], revoke=False, read_only=False)
    me = database.cluster.superuser
    with pytest.raises(ValueError, match=f"cannot fence role '{me}'.*connect as another role"):
        database.hook.apply_write_fence([me], [T])


def test_a_fence_that_would_not_hold_changes_nothing(database: Database, role: str) -> None:
    database.sql("GRANT UPDATE ON t TO PUBLIC")
    with pytest.raises(FenceNotHeldError, match=r"nothing was changed: .*UPDATE"):
        database.hook.apply_write_fence([role], [T])
    assert _privileges(database, role) == ["DELETE", "INSERT"]
    assert database.hook.release_write_fence([role])[0].fenced is False  # no state was saved


def test_applied_twice_and_released_exactly(database: Database, role: str) -> None:
    hook = database.hook
    first = hook.apply_write_fence([role], [T])
    assert _privileges(database, role) == []
    assert {g.privilege for g in first.states[0].grants} == {"INSERT", "DELETE"}
    again = hook.apply_write_fence([role], [T], read_only=True)  # nothing left to revoke
    assert again.states[0].grants == first.states[0].grants and again.states[0].read_only_set
    (released,) = hook.release_write_fence([role])
    assert released.restored == (FenceGrant(T, "DELETE", False), FenceGrant(T, "INSERT", False))
    assert released.read_only_restored_to == "(reset)"
    assert _privileges(database, role) == ["DELETE", "INSERT"]
    assert hook.release_write_fence([role])[0].fenced is False


def test_the_guard_is_put_on_or_names_whom_it_waited_for(database: Database, role: str) -> None:
    hook = database.hook
    with database.cluster.connect(database.name) as writer:
        writer.execute("BEGIN")
        writer.execute("INSERT INTO t VALUES (1)")
        waited = hook.guard_write_fence([role], [T], lock_timeout_s=0.1)
        assert not waited.installed
        assert [h["pid"] for h in waited.holders] == [writer.info.backend_pid]
        writer.execute("ROLLBACK")
    done = hook.guard_write_fence([role], [T], lock_timeout_s=5)
    assert done.installed and done.members == (role,)
    hook.release_write_fence([role])  # not fenced, but the guard goes with the last release
    assert database.sql(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'pglogrepl_write_fence'"
    ) == [(0,)]
