"""The write fence: its arguments, and on live clusters what it blocks, what it refuses and
how its release restores exactly what was there.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.exceptions import FenceNotHeldError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.operators.arguments import names
from airflow_pglogrepl.operators.fence import WriteFenceOperator, WriteFenceReleaseOperator
from tests.support.airflow import FakeTI, context
from tests.support.boundary import task_fails_with
from tests.support.cutover import HOSTILE_TABLE_SQL, Pair


def test_fence_operator_validates_its_arguments() -> None:
    base: dict[str, Any] = {"task_id": "f", "postgres_conn_id": "pub"}
    with pytest.raises(ValueError, match="at least one role"):
        WriteFenceOperator(**base, roles=[], tables=["t"])
    with pytest.raises(ValueError, match="tables, a publication"):
        WriteFenceOperator(**base, roles=["app"])
    with pytest.raises(ValueError, match="revoke_privileges, read_only"):
        WriteFenceOperator(**base, roles=["app"], tables=["t"], revoke_privileges=False)
    with pytest.raises(ValueError, match="terminate must be"):
        WriteFenceOperator(**base, roles=["app"], tables=["t"], terminate="all")  # type: ignore[arg-type]
    op = WriteFenceOperator(**base, roles="app", publication="{{ params.pub }}")
    assert "publication" in op.template_fields and names(op.roles) == ["app"]
    assert names(None) == [] and names(("a", "b")) == ["a", "b"]


# The tests below depend on the server's major version: make test runs them on 15 to 18.


def _acls(pair: Pair) -> list[tuple[Any, ...]]:
    return pair.pub(
        "SELECT c.relname, c.relacl::text FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
        " ORDER BY 1"
    )


def _role_settings(pair: Pair, role: str) -> list[str]:
    rows = pair.pub(
        "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE r.rolname = %s AND s.setdatabase ="
        " (SELECT oid FROM pg_database WHERE datname = current_database())",
        (role,),
    )
    return sorted(rows[0][0]) if rows else []


# -- write fence ---------------------------------------------------------------------------------


@pytest.mark.pgversion
def test_fence_blocks_fenced_writes_and_release_restores_exactly(pair: Pair) -> None:
    pair.pub(f"CREATE TABLE {HOSTILE_TABLE_SQL} (id serial PRIMARY KEY, v text)")
    pair.pub("CREATE TABLE items (id int PRIMARY KEY)")
    pair.pub("CREATE TABLE events (id int, at date) PARTITION BY RANGE (at)")
    pair.pub("CREATE TABLE events_2024 PARTITION OF events"
             " FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")  # fmt: skip
    pair.pub(f"CREATE PUBLICATION fence_pub FOR TABLE {HOSTILE_TABLE_SQL}, items, events")
    app, app_pw = pair.role("app")
    other, _ = pair.role("other")
    ident = sql.Identifier(app)
    grants = [
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {HOSTILE_TABLE_SQL}, events TO {{}}",
        "GRANT INSERT, SELECT ON items TO {} WITH GRANT OPTION",
        "GRANT INSERT ON events_2024 TO {}",  # a direct write to the partition, too
        f'GRANT USAGE ON SEQUENCE {HOSTILE_TABLE_SQL[:-1]}_id_seq" TO {{}}',
    ]
    for grant in grants:
        pair.pub(sql.SQL(grant).format(ident))
    pair.pub(sql.SQL("GRANT UPDATE ON items TO {}").format(sql.Identifier(other)))
    acls_before = _acls(pair)

    writer, open_txn = pair.connect_as(app, app_pw), pair.connect_as(app, app_pw)
    writer.execute(f"INSERT INTO {HOSTILE_TABLE_SQL} (v) VALUES ('before the fence')")
    last_write = LSN(pair.pub("SELECT pg_current_wal_lsn()")[0][0])
    open_txn.execute("BEGIN")
    open_txn.execute("INSERT INTO items VALUES (1)")  # never committed: ended by the fence

    fence = WriteFenceOperator(
        task_id="write_fence", postgres_conn_id=pair.pub_conn, roles=[app, other],
        publication="fence_pub", grace_period=0.5,
    )  # fmt: skip
    ti = FakeTI()
    result = fence.execute(context(ti))
    assert LSN(result["fence_lsn"]) >= last_write
    assert ti.pushed["fence_lsn"] == result["fence_lsn"]
    assert [t["pid"] for t in result["terminated"]] == [open_txn.info.backend_pid]
    assert "public.events_2024" in result["tables"]  # partitions are fenced with their parent
    with pytest.raises(psycopg.OperationalError):
        open_txn.execute("COMMIT")
    assert pair.pub("SELECT count(*) FROM items") == [(0,)]

    blocked = pair.connect_as(app, app_pw)
    for statement in (
        f"INSERT INTO {HOSTILE_TABLE_SQL} (v) VALUES ('after')",
        "INSERT INTO items VALUES (2)",
        "INSERT INTO events VALUES (1, '2024-05-01')",
        "INSERT INTO events_2024 VALUES (1, '2024-05-01')",
        f"DELETE FROM {HOSTILE_TABLE_SQL}",
    ):
        with pytest.raises(pgerr.InsufficientPrivilege):
            blocked.execute(statement)
    assert blocked.execute(f"SELECT count(*) FROM {HOSTILE_TABLE_SQL}").fetchone() == (1,)

    again = fence.execute(context())  # idempotent: nothing new to revoke, saved state kept
    assert again["changes"] == []
    assert again["saved"] == result["saved"]
    assert LSN(again["fence_lsn"]) >= LSN(result["fence_lsn"])

    release = WriteFenceReleaseOperator(task_id="release", postgres_conn_id=pair.pub_conn)
    released = release.execute(context())
    assert sorted(released["roles_released"]) == sorted([app, other])
    assert _acls(pair) == acls_before
    assert _role_settings(pair, app) == []
    blocked.execute("INSERT INTO items VALUES (3)")
    assert release.execute(context())["released"] == []  # nothing fenced any more

    for conn in (writer, open_txn, blocked):
        conn.close()


@pytest.mark.pgversion
def test_fence_refuses_a_fence_that_cannot_hold_and_read_only_mode(pair: Pair) -> None:
    pair.pub("CREATE TABLE ro_t (id int PRIMARY KEY)")
    boss, _ = pair.role("boss")
    pair.pub(sql.SQL("ALTER ROLE {} SUPERUSER").format(sql.Identifier(boss)))
    acls_before = _acls(pair)
    with task_fails_with(FenceNotHeldError, match="is a superuser"):
        WriteFenceOperator(
            task_id="f", postgres_conn_id=pair.pub_conn, roles=[boss], tables=["ro_t"]
        ).execute(context())
    assert _acls(pair) == acls_before and _role_settings(pair, boss) == []

    reader, reader_pw = pair.role("reader")
    ident = sql.Identifier(reader)
    pair.pub(sql.SQL("GRANT INSERT, SELECT ON ro_t TO {}").format(ident))
    pair.pub(
        sql.SQL("ALTER ROLE {} IN DATABASE {} SET default_transaction_read_only = off").format(
            ident, sql.Identifier(pair.pub_db)
        )
    )
    idle = pair.connect_as(reader, reader_pw)  # opened before the fence: would stay writable
    result = WriteFenceOperator(
        task_id="f", postgres_conn_id=pair.pub_conn, roles=[reader], tables=["ro_t"],
        revoke_privileges=False, read_only=True, grace_period=0,
    ).execute(context())  # fmt: skip
    assert [t["pid"] for t in result["terminated"]] == [idle.info.backend_pid]
    fresh = pair.connect_as(reader, reader_pw)
    with pytest.raises(pgerr.ReadOnlySqlTransaction):
        fresh.execute("INSERT INTO ro_t VALUES (1)")
    fresh.close()

    WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn, roles=[reader]).execute(
        context()
    )
    assert _role_settings(pair, reader) == ["default_transaction_read_only=off"]
    with pair.connect_as(reader, reader_pw) as conn:
        conn.execute("INSERT INTO ro_t VALUES (1)")


@pytest.mark.pgversion
def test_the_fence_holds_against_every_way_around_it(pair: Pair) -> None:
    """Each path around privileges and read-only defaults: a write after the fence fails, or
    the fence refuses to report success. Before the guard, each of these wrote after it."""
    pair.pub("CREATE TABLE f_parent (id int); CREATE TABLE f_t (id int PRIMARY KEY);"
             " ALTER TABLE f_t INHERIT f_parent")  # fmt: skip
    app, app_pw = pair.role("app")
    alice, alice_pw = pair.role("alice")  # logs in as herself, writes as app
    owner, _ = pair.role("owner")
    app_id, alice_id, owner_id = (sql.Identifier(r) for r in (app, alice, owner))
    pair.pub(sql.SQL("GRANT SELECT, INSERT ON f_t TO {}, {}").format(app_id, owner_id))
    pair.pub(sql.SQL("GRANT SELECT, DELETE ON f_parent TO {}").format(app_id))
    pair.pub(sql.SQL("GRANT {} TO {}").format(app_id, alice_id))
    pair.pub(sql.SQL("ALTER ROLE {} NOINHERIT").format(alice_id))
    pair.pub(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(owner_id))
    pair.pub(sql.SQL(
        "CREATE FUNCTION public.add_row(i int) RETURNS void LANGUAGE sql SECURITY DEFINER"
        " AS 'INSERT INTO public.f_t VALUES (i)'; ALTER FUNCTION public.add_row(int) OWNER TO {}"
    ).format(owner_id))  # fmt: skip

    # the guard's schema made beforehand by a role that could then drop the guard: refused
    pair.pub(sql.SQL("CREATE SCHEMA pglogrepl AUTHORIZATION {}").format(app_id))
    with task_fails_with(FenceNotHeldError, match=r"schema 'pglogrepl' exists and belongs to"):
        WriteFenceOperator(task_id="f", postgres_conn_id=pair.pub_conn, roles=[owner],
                           tables=["f_t"], revoke_privileges=False, read_only=True,
                           grace_period=0.3).execute(context())  # fmt: skip
    pair.pub("DROP SCHEMA pglogrepl")
    WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn).execute(context())

    # SET ROLE: alice's open transaction wrote as app before the fence
    set_role = pair.connect_as(alice, alice_pw)
    set_role.execute("BEGIN")
    set_role.execute(sql.SQL("SET ROLE {}").format(app_id))
    set_role.execute("INSERT INTO f_t VALUES (1)")
    # and a transaction of app's open since before the fence that wrote nothing fenced: the
    # guard does not see it, the wait ends it; the summary names both sessions ended
    reader = pair.connect_as(app, app_pw)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM f_t")

    def fence(**options: Any) -> dict[str, Any]:
        return WriteFenceOperator(
            task_id="write_fence", postgres_conn_id=pair.pub_conn, roles=[app],
            tables=["f_t"], grace_period=0.3, **options,
        ).execute(context())  # fmt: skip

    result = fence(revoke_privileges=False, read_only=True)
    ended = [t["pid"] for t in result["terminated"]]
    assert set_role.info.backend_pid in ended and reader.info.backend_pid in ended, ended
    with pytest.raises(psycopg.OperationalError):
        set_role.execute("COMMIT")
    assert result["guard"] and any("DISABLE TRIGGER" in p for p in result["not_stopped"])

    fresh = pair.connect_as(app, app_pw)  # read_only is only a default
    fresh.execute("BEGIN READ WRITE")
    with pytest.raises(pgerr.ReadOnlySqlTransaction, match="write fence"):
        fresh.execute("INSERT INTO f_t VALUES (2)")
    fresh.execute("ROLLBACK")
    fresh.execute("SET default_transaction_read_only = off")
    with pytest.raises(pgerr.ReadOnlySqlTransaction, match="write fence"):  # SECURITY DEFINER
        fresh.execute("SELECT public.add_row(3)")
    with (
        pytest.raises(pgerr.ReadOnlySqlTransaction, match="write fence"),
        fresh.cursor().copy("COPY f_t FROM STDIN") as copy,
    ):
        copy.write_row((7,))
    # a session's own pg_temp.text must not change what the guard compares
    fresh.execute("CREATE DOMAIN pg_temp.text AS varchar(1)")
    with pytest.raises(pgerr.ReadOnlySqlTransaction, match="write fence"):
        fresh.execute("INSERT INTO f_t VALUES (8)")
    pair.pub("INSERT INTO f_t VALUES (9)")  # the fence's own role is not fenced
    with pytest.raises(pgerr.ReadOnlySqlTransaction, match="write fence"):  # through the parent
        fresh.execute("DELETE FROM f_parent")
    pair.pub("DELETE FROM f_t WHERE id = 9")
    other = pair.connect_as(alice, alice_pw)  # a new session of a member, SET ROLE again
    other.execute(sql.SQL("SET ROLE {}").format(app_id))
    other.execute("SET default_transaction_read_only = off")
    with pytest.raises(pgerr.ReadOnlySqlTransaction, match="write fence"):
        other.execute("INSERT INTO f_t VALUES (4)")
    assert pair.pub("SELECT count(*) FROM f_t") == [(0,)]
    WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn).execute(context())
    assert pair.pub("SELECT count(*) FROM pg_trigger WHERE tgname = 'pglogrepl_write_fence'") == [
        (0,)
    ]
    assert pair.pub("SELECT count(*) FROM pg_namespace WHERE nspname = 'pglogrepl'") == [(0,)]
    with pair.connect_as(app, app_pw) as again:
        again.execute("INSERT INTO f_t VALUES (5)")  # released: writes again

    # a prepared transaction holds writes the fence cannot end: it refuses to report success
    prepared = pair.connect_as(app, app_pw)
    prepared.execute("BEGIN")
    prepared.execute("INSERT INTO f_t VALUES (6)")
    prepared.execute("PREPARE TRANSACTION 'fence_test_gid'")
    try:
        with task_fails_with(FenceNotHeldError, match="prepared transaction 'fence_test_gid'"):
            fence()
    finally:
        pair.pub("ROLLBACK PREPARED 'fence_test_gid'")
        WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn).execute(context())
    for conn in (set_role, fresh, other, prepared):
        conn.close()
