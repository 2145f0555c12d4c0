"""Cutover toolkit on live clusters: write fence, sequences, parity, apply conflicts, finalize."""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException
from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.conninfo import make_dsn
from airflow_pglogrepl.exceptions import FenceNotHeldError, ReplicationFailedError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.operators.conflicts import (
    SkipConflictingTransactionOperator,
    SubscriptionErrorCheckOperator,
)
from airflow_pglogrepl.operators.fence import WriteFenceOperator, WriteFenceReleaseOperator
from airflow_pglogrepl.operators.finalize import FinalizeCutoverOperator
from airflow_pglogrepl.operators.parity import TableParityCheckOperator
from airflow_pglogrepl.operators.publication import CreatePublicationOperator
from airflow_pglogrepl.operators.sequences import SyncSequencesOperator
from airflow_pglogrepl.operators.subscription import CreateSubscriptionOperator
from airflow_pglogrepl.sensors.progress import LsnCatchUpSensor
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.testing.wait import wait_until
from airflow_pglogrepl.versions import Features
from tests.conftest import set_airflow_connection

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion

_ids = itertools.count(1)
HOSTILE_TABLE = 'Ordërs; "x" tbl'
HOSTILE_TABLE_SQL = '"Ordërs; ""x"" tbl"'


class FakeTI:
    """Just enough of a TaskInstance for operators that push XCom."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _ctx(ti: FakeTI | None = None) -> Any:
    return {"ti": ti or FakeTI()}


@dataclass
class Pair:
    """A publisher database and a subscriber database, Airflow connections, roles to clean up."""

    publisher: PgCluster
    pub_db: str
    subscriber: PgCluster
    sub_db: str
    pub_conn: str
    sub_conn: str
    roles: list[str] = field(default_factory=list)

    def pub(self, statement: Any, params: Any = None) -> list[Any]:
        return self.publisher.execute(statement, params, dbname=self.pub_db)

    def sub(self, statement: Any, params: Any = None) -> list[Any]:
        return self.subscriber.execute(statement, params, dbname=self.sub_db)

    def both(self, statement: Any) -> None:
        self.pub(statement)
        self.sub(statement)

    def role(self, label: str) -> tuple[str, str]:
        """A new login role on the publisher with a hostile name; returns (name, password)."""
        name = f'{label} "rôle"; {next(_ids)}-{secrets.token_hex(3)}'
        password = secrets.token_urlsafe(12)
        self.pub(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
        self.roles.append(name)
        return name, password

    def connect_as(self, role: str, password: str) -> psycopg.Connection[Any]:
        params = {**self.publisher.params(self.pub_db), "user": role, "password": password}
        return psycopg.connect(make_dsn(params), autocommit=True)

    def pub_hook(self) -> PgLogicalReplicationHook:
        return PgLogicalReplicationHook(postgres_conn_id=self.pub_conn)

    def sub_hook(self) -> PgLogicalReplicationHook:
        return PgLogicalReplicationHook(postgres_conn_id=self.sub_conn)


@pytest.fixture
def pair(publisher: PgCluster, subscriber: PgCluster) -> Iterator[Pair]:
    n = next(_ids)
    pub_db, sub_db = f"cutover_pub_{n}", f"cutover_sub_{n}"
    publisher.create_database(pub_db)
    subscriber.create_database(sub_db)
    set_airflow_connection(f"cutover_pub_{n}", publisher.airflow_uri(pub_db))
    set_airflow_connection(f"cutover_sub_{n}", subscriber.airflow_uri(sub_db))
    p = Pair(publisher, pub_db, subscriber, sub_db, f"cutover_pub_{n}", f"cutover_sub_{n}")
    yield p
    # Subscriptions hold slots and workers (either direction after a finalize): drop them.
    for hook, run in ((p.sub_hook(), p.sub), (p.pub_hook(), p.pub)):
        mine = run(
            "SELECT subname FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid"
            " WHERE d.datname = current_database()"
        )
        for (name,) in mine:
            hook.drop_subscription(str(name))
    for role in p.roles:
        p.pub(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        p.pub(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


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


def _subscribe(pair: Pair, publication: str, subscription: str, tables: list[str]) -> None:
    CreatePublicationOperator(
        task_id="pub", publication=publication, postgres_conn_id=pair.pub_conn, tables=tables
    ).execute(_ctx())
    CreateSubscriptionOperator(
        task_id="sub", subscription=subscription, publications=[publication],
        publisher_conn_id=pair.pub_conn, subscriber_conn_id=pair.sub_conn,
    ).execute(_ctx())  # fmt: skip
    hook = pair.sub_hook()
    wait_until(
        lambda: hook.subscription_status(subscription).state_counts == {"r": len(tables)},
        what=f"{subscription} ready",
    )


# -- write fence ---------------------------------------------------------------------------------


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
    result = fence.execute(_ctx(ti))
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

    again = fence.execute(_ctx())  # idempotent: nothing new to revoke, saved state kept
    assert again["changes"] == []
    assert again["saved"] == result["saved"]
    assert LSN(again["fence_lsn"]) >= LSN(result["fence_lsn"])

    release = WriteFenceReleaseOperator(task_id="release", postgres_conn_id=pair.pub_conn)
    released = release.execute(_ctx())
    assert sorted(released["roles_released"]) == sorted([app, other])
    assert _acls(pair) == acls_before
    assert _role_settings(pair, app) == []
    blocked.execute("INSERT INTO items VALUES (3)")
    assert release.execute(_ctx())["released"] == []  # nothing fenced any more

    for conn in (writer, open_txn, blocked):
        conn.close()


def test_fence_refuses_a_fence_that_cannot_hold_and_read_only_mode(pair: Pair) -> None:
    pair.pub("CREATE TABLE ro_t (id int PRIMARY KEY)")
    boss, _ = pair.role("boss")
    pair.pub(sql.SQL("ALTER ROLE {} SUPERUSER").format(sql.Identifier(boss)))
    acls_before = _acls(pair)
    with pytest.raises(FenceNotHeldError, match="is a superuser"):
        WriteFenceOperator(
            task_id="f", postgres_conn_id=pair.pub_conn, roles=[boss], tables=["ro_t"]
        ).execute(_ctx())
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
    ).execute(_ctx())  # fmt: skip
    assert [t["pid"] for t in result["terminated"]] == [idle.info.backend_pid]
    fresh = pair.connect_as(reader, reader_pw)
    with pytest.raises(pgerr.ReadOnlySqlTransaction):
        fresh.execute("INSERT INTO ro_t VALUES (1)")
    fresh.close()

    WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn, roles=[reader]).execute(
        _ctx()
    )
    assert _role_settings(pair, reader) == ["default_transaction_read_only=off"]
    with pair.connect_as(reader, reader_pw) as conn:
        conn.execute("INSERT INTO ro_t VALUES (1)")


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
    with pytest.raises(FenceNotHeldError, match=r"schema 'pglogrepl' exists and belongs to"):
        WriteFenceOperator(task_id="f", postgres_conn_id=pair.pub_conn, roles=[owner],
                           tables=["f_t"], revoke_privileges=False, read_only=True,
                           grace_period=0.3).execute(_ctx())  # fmt: skip
    pair.pub("DROP SCHEMA pglogrepl")
    WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn).execute(_ctx())

    # SET ROLE: alice's open transaction wrote as app before the fence
    set_role = pair.connect_as(alice, alice_pw)
    set_role.execute("BEGIN")
    set_role.execute(sql.SQL("SET ROLE {}").format(app_id))
    set_role.execute("INSERT INTO f_t VALUES (1)")

    def fence(**options: Any) -> dict[str, Any]:
        return WriteFenceOperator(
            task_id="write_fence", postgres_conn_id=pair.pub_conn, roles=[app],
            tables=["f_t"], grace_period=0.3, **options,
        ).execute(_ctx())  # fmt: skip

    result = fence(revoke_privileges=False, read_only=True)
    assert set_role.info.backend_pid in [t["pid"] for t in result["terminated"]]
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
    WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn).execute(_ctx())
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
        with pytest.raises(FenceNotHeldError, match="prepared transaction 'fence_test_gid'"):
            fence()
    finally:
        pair.pub("ROLLBACK PREPARED 'fence_test_gid'")
        WriteFenceReleaseOperator(task_id="r", postgres_conn_id=pair.pub_conn).execute(_ctx())
    for conn in (set_role, fresh, other, prepared):
        conn.close()


# -- sequences -----------------------------------------------------------------------------------


def test_sync_sequences_puts_subscriber_past_the_publisher(pair: Pair) -> None:
    pair.both("CREATE TABLE s_identity (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
              " v text)")  # fmt: skip
    pair.both(f"CREATE TABLE {HOSTILE_TABLE_SQL} (id serial PRIMARY KEY, v text)")
    pair.both("CREATE SEQUENCE free_seq")
    pair.pub("INSERT INTO s_identity (v) SELECT 'r' FROM generate_series(1, 50)")
    pair.pub(f"INSERT INTO {HOSTILE_TABLE_SQL} (v) SELECT 'r' FROM generate_series(1, 30)")
    pair.pub(f"DELETE FROM {HOSTILE_TABLE_SQL} WHERE id > 20")  # the sequence stays at 30
    pair.pub("SELECT nextval('free_seq') FROM generate_series(1, 7)")
    # What replication would have copied: the rows, never the sequences.
    pair.sub("INSERT INTO s_identity OVERRIDING SYSTEM VALUE"
             " SELECT g, 'r' FROM generate_series(1, 55) g")  # fmt: skip
    pair.sub(f"INSERT INTO {HOSTILE_TABLE_SQL} SELECT g, 'r' FROM generate_series(1, 20) g")

    def sync(**kwargs: Any) -> dict[str, Any]:
        return SyncSequencesOperator(
            task_id="seq", publisher_conn_id=pair.pub_conn, subscriber_conn_id=pair.sub_conn,
            tables=["s_identity", f"public.{HOSTILE_TABLE_SQL}"], sequences=["free_seq"],
            **kwargs,
        ).execute(_ctx())  # fmt: skip

    plan = sync(margin=100, plan_only=True)
    assert plan["changed"] == 0
    assert pair.sub("SELECT last_value, is_called FROM free_seq") == [(1, False)]
    result = sync(margin=100)
    by_seq = {e["sequence"]: e for e in result["sequences"]}
    assert by_seq["public.s_identity_id_seq"]["new_value"] == 155  # subscriber max(id) wins
    assert by_seq["public.s_identity_id_seq"]["publisher_last_value"] == 50
    hostile_seq = by_seq[f'public."{HOSTILE_TABLE.replace(chr(34), chr(34) * 2)}_id_seq"']
    assert hostile_seq["new_value"] == 130  # the publisher's last_value wins
    assert by_seq["public.free_seq"]["new_value"] == 107
    assert result["changed"] == 3
    assert [e["new_value"] for e in plan["sequences"]] == [e["new_value"] for e in
                                                            result["sequences"]]  # fmt: skip
    for seq, floor in (("s_identity_id_seq", 155), ("free_seq", 107)):
        nextval = pair.sub(f"SELECT nextval('{seq}')")[0][0]
        publisher_last = pair.pub(f"SELECT coalesce(last_value, 0) FROM pg_sequences"
                                  f" WHERE sequencename = '{seq}'")[0][0]  # fmt: skip
        assert nextval > floor and nextval > publisher_last
    pair.sub("INSERT INTO s_identity (v) VALUES ('new on the subscriber')")  # no key collision
    again = sync(margin=0)  # never moves a sequence backwards
    assert again["changed"] == 0


def _conn_as(pair: Pair, role: str, password: str) -> str:
    """An Airflow connection id for ``role`` on the publisher database."""
    from urllib.parse import quote

    conn_id = f"as_{next(_ids)}"
    cluster = pair.publisher
    set_airflow_connection(conn_id, f"postgres://{quote(role, safe='')}:"
                           f"{quote(password, safe='')}@{cluster.host}:{cluster.port}/"
                           f"{pair.pub_db}")  # fmt: skip
    return conn_id


def test_privileges_the_cutover_lacks_are_reported_not_swallowed(pair: Pair) -> None:
    """A sequence the role may not read has last_value NULL, as if never used: the sync would
    have skipped it silently. A fence LSN marked without pg_logical_emit_message flushes
    nothing. Both are refused, naming the grant."""
    from airflow_pglogrepl.exceptions import PrivilegeError

    pair.both("CREATE SEQUENCE guarded_seq")
    pair.pub("SELECT nextval('guarded_seq') FROM generate_series(1, 9)")
    role, password = pair.role("seq")
    publisher_as_role = _conn_as(pair, role, password)
    with pytest.raises(AirflowFailException, match=r"guarded_seq: this role may not read.*GRANT"):
        SyncSequencesOperator(
            task_id="seq", publisher_conn_id=publisher_as_role, subscriber_conn_id=pair.sub_conn,
            sequences=["guarded_seq"],
        ).execute(_ctx())  # fmt: skip
    assert pair.sub("SELECT last_value, is_called FROM guarded_seq") == [(1, False)]

    # function privileges are per database: this one only. The signature differs by version
    # (17 added an argument); the GRANT the error names must be one the server takes.
    version = int(pair.pub("SHOW server_version_num")[0][0])
    signature = Features.of(version).emit_message_signature
    pair.pub(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
    hook = PgLogicalReplicationHook(postgres_conn_id=publisher_as_role)
    with pytest.raises(PrivilegeError, match=r"mark the fence LSN.*GRANT EXECUTE") as refused:
        hook.mark_fence_lsn({"test": True})
    grant = re.search(r"(GRANT EXECUTE ON FUNCTION .*? TO .*?) in this database",
                      str(refused.value))  # fmt: skip
    assert grant is not None, str(refused.value)
    pair.pub(grant.group(1))
    assert hook.mark_fence_lsn({"test": True}) > LSN("0/0")


def test_a_row_filter_cannot_leave_its_where(pair: Pair) -> None:
    """Before: the filter was pasted as given, and this one published a second table."""
    pair.pub("CREATE TABLE open_t (id int PRIMARY KEY, region text);"
             " CREATE TABLE secret_t (id int PRIMARY KEY)")  # fmt: skip
    operator = CreatePublicationOperator(
        task_id="pub", publication="filtered", postgres_conn_id=pair.pub_conn, tables=["open_t"],
        row_filters={"open_t": "true) , public.secret_t WHERE (true"},
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"row filter of public\.open_t .*closes more"):
        operator.execute(_ctx())
    assert pair.pub("SELECT tablename FROM pg_publication_tables WHERE pubname = 'filtered'") == []


# -- parity --------------------------------------------------------------------------------------


def test_parity_passes_on_equal_tables_and_names_each_difference(pair: Pair) -> None:
    pair.both("CREATE TABLE p_mixed (id int PRIMARY KEY, v text, at timestamptz, f float8,"
              " b bytea, j jsonb, n numeric)")  # fmt: skip
    pair.pub("CREATE TABLE p_order (id int PRIMARY KEY, a text, b int)")
    pair.sub("CREATE TABLE p_order (b int, extra text DEFAULT 'sub only', a text,"
             " id int PRIMARY KEY)")  # fmt: skip
    pair.both(f"CREATE TABLE {HOSTILE_TABLE_SQL} (id int, v text)")  # no key: duplicates count
    pair.pub("CREATE TABLE p_only_on_publisher (id int)")
    fill = {
        "p_mixed": "INSERT INTO p_mixed SELECT g, md5(g::text), timestamptz '2024-01-01 00:00Z'"
                   " + g * interval '1 hour', g / 3.0, decode(md5(g::text), 'hex'),"
                   " jsonb_build_object('k', g), g * 1.5 FROM generate_series(1, 2000) g",
        "p_order": "INSERT INTO p_order (id, a, b) SELECT g, 'a' || g, g"
                   " FROM generate_series(1, 500) g",
        "hostile": f"INSERT INTO {HOSTILE_TABLE_SQL} SELECT g % 10, 'dup'"
                   " FROM generate_series(1, 100) g",
    }  # fmt: skip
    for statement in fill.values():
        pair.both(statement)
    # Text output must not depend on the session: the subscriber's database uses another zone.
    pair.sub(sql.SQL("ALTER DATABASE {} SET timezone = 'Asia/Tokyo'").format(
        sql.Identifier(pair.sub_db)))  # fmt: skip

    def check(*tables: str) -> Any:
        return TableParityCheckOperator(
            task_id="parity", publisher_conn_id=pair.pub_conn, subscriber_conn_id=pair.sub_conn,
            tables=list(tables), parallelism=3,
        )  # fmt: skip

    tables = ["p_mixed", "p_order", f"public.{HOSTILE_TABLE_SQL}"]
    report = check(*tables).execute(_ctx())
    assert report["passed"] and report["checked"] == 3
    assert {t["publisher_checksum"] == t["subscriber_checksum"] for t in report["tables"]} == {True}
    assert report["tables"][0]["publisher_rows"] == 2000

    pair.sub("UPDATE p_mixed SET v = 'planted' WHERE id = 5")
    pair.sub(f"DELETE FROM {HOSTILE_TABLE_SQL} WHERE ctid IN"
             f" (SELECT ctid FROM {HOSTILE_TABLE_SQL} LIMIT 1)")  # fmt: skip
    ti = FakeTI()
    with pytest.raises(AirflowFailException) as failure:
        check(*tables, "p_only_on_publisher").execute(_ctx(ti))
    text = str(failure.value)
    assert "failed for 3 of 4 tables" in text
    assert "public.p_mixed: same row count (2000) but checksums differ" in text
    assert f"public.{HOSTILE_TABLE_SQL}: subscriber has 1 row fewer (99 vs 100" in text
    assert "public.p_only_on_publisher: missing on the subscriber" in text
    assert "p_order" not in text
    pushed = ti.pushed["return_value"]
    assert pushed["differing"] == ["public.p_mixed", f"public.{HOSTILE_TABLE_SQL}",
                                   "public.p_only_on_publisher"]  # fmt: skip
    assert pushed["tables"][2]["row_difference"] == -1


# -- apply conflicts -----------------------------------------------------------------------------

_FINISHED_AT = re.compile(
    r'replication target relation "public\.conflict_t" in transaction (\d+), '
    r"finished at ([0-9A-F]+/[0-9A-F]+)"
)


def test_apply_conflict_is_reported_with_its_relation_and_skipped_only_given_the_lsn(
    pair: Pair,
) -> None:
    pair.both("CREATE TABLE conflict_t (id int PRIMARY KEY, v text)")
    pair.both("CREATE TABLE calm_t (id int PRIMARY KEY)")
    pair.pub("INSERT INTO conflict_t SELECT g, 'initial' FROM generate_series(1, 10) g")
    _subscribe(pair, "conflict_pub", "conflict_sub", ["conflict_t", "calm_t"])
    pair.pub("INSERT INTO conflict_t VALUES (11, 'streamed')")  # moves the origin past the copy
    wait_until(lambda: pair.sub("SELECT count(*) FROM conflict_t") == [(11,)], what="apply")

    def check() -> SubscriptionErrorCheckOperator:
        return SubscriptionErrorCheckOperator(
            task_id="check", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
            publisher_conn_id=pair.pub_conn, worker_grace_period=10,
        )  # fmt: skip

    assert check().execute(_ctx())["problems"] == []

    pair.sub("INSERT INTO conflict_t VALUES (100, 'planted on the subscriber')")
    with pair.publisher.connect(pair.pub_db) as conn, conn.transaction():
        conn.execute("INSERT INTO calm_t VALUES (1)")
        conn.execute("INSERT INTO conflict_t VALUES (100, 'from the publisher'), (101, 'too')")
    hook = pair.sub_hook()
    wait_until(lambda: (hook.subscription_errors("conflict_sub").apply_error_count or 0) >= 1,
               what="apply error counted")  # fmt: skip

    ti = FakeTI()
    with pytest.raises(AirflowFailException) as failure:
        check().execute(_ctx(ti))
    report = ti.pushed["return_value"]
    assert report["relations_involved"] == ["public.calm_t", "public.conflict_t"]
    pending = report["pending_transaction"]
    assert {c["table"]: c["count"] for c in pending["changes"]} == {
        "public.calm_t": 1, "public.conflict_t": 2}  # fmt: skip
    assert "public.conflict_t (2 insert)" in str(failure.value)
    assert "apply error" in str(failure.value)

    # The finish LSN, as the operator is told it: from the subscriber's server log.
    match = wait_until(lambda: _FINISHED_AT.search(pair.subscriber.logfile.read_text()),
                       what="the conflict in the subscriber log")  # fmt: skip
    assert match is not None
    xid, logged_lsn = match.group(1), match.group(2)
    assert logged_lsn == pending["finish_lsn"] and int(xid) == pending["xid"]

    for missing in ("", None, "None"):
        with pytest.raises(ValueError, match="explicitly"):
            SkipConflictingTransactionOperator(
                task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
                lsn=missing,  # type: ignore[arg-type]
            )  # fmt: skip
    with pytest.raises(TypeError):
        SkipConflictingTransactionOperator(  # type: ignore[call-arg]
            task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn
        )
    with pytest.raises(Exception, match="origin LSN"):  # behind what was applied: refused
        SkipConflictingTransactionOperator(
            task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
            lsn="0/1",
        ).execute(_ctx())  # fmt: skip
    with pytest.raises(ReplicationFailedError, match="withdrawn"):  # not that transaction's
        SkipConflictingTransactionOperator(
            task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
            lsn=str(LSN(logged_lsn) + 8), wait_timeout=6,
        ).execute(_ctx())  # fmt: skip
    errors = hook.subscription_errors("conflict_sub")
    assert errors.skip_lsn is None and (errors.apply_error_count or 0) >= 1
    assert pair.sub("SELECT count(*) FROM calm_t") == [(0,)]

    skipped = SkipConflictingTransactionOperator(
        task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
        lsn=logged_lsn,
    ).execute(_ctx())  # fmt: skip
    assert skipped == {"subscription": "conflict_sub", "lsn": logged_lsn, "method": "skip",
                       "skipped": True}  # fmt: skip
    pair.pub("INSERT INTO conflict_t VALUES (102, 'after the skip')")
    wait_until(lambda: pair.sub("SELECT id, v FROM conflict_t WHERE id >= 100 ORDER BY id")
               == [(100, "planted on the subscriber"), (102, "after the skip")],
               what="replication resumed past the skipped transaction")  # fmt: skip
    assert pair.sub("SELECT count(*) FROM calm_t") == [(0,)]  # the whole transaction was skipped
    assert check().execute(_ctx())["problems"] == []


def test_a_silently_skipped_update_fails_the_check_where_the_server_counts_it(pair: Pair) -> None:
    """PostgreSQL 18 counts conflicts the apply worker resolves by itself: an update of a row
    the subscriber lacks is skipped without an error, and the subscriber has diverged. The
    check fails on it there; older servers do not count it (conflicts is None)."""
    pair.both("CREATE TABLE diverge_t (id int PRIMARY KEY, v text)")
    pair.pub("INSERT INTO diverge_t SELECT g, 'initial' FROM generate_series(1, 5) g")
    _subscribe(pair, "diverge_pub", "diverge_sub", ["diverge_t"])
    pair.sub("DELETE FROM diverge_t WHERE id = 3")  # a row only the publisher has now
    pair.pub("UPDATE diverge_t SET v = 'changed' WHERE id IN (3, 4)")
    wait_until(lambda: pair.sub("SELECT v FROM diverge_t WHERE id = 4") == [("changed",)],
               what="the update applied")  # fmt: skip
    hook = pair.sub_hook()
    check = SubscriptionErrorCheckOperator(
        task_id="check", subscription="diverge_sub", subscriber_conn_id=pair.sub_conn,
        worker_grace_period=10,
    )  # fmt: skip
    if int(pair.sub("SHOW server_version_num")[0][0]) < 180000:
        assert hook.subscription_errors("diverge_sub").conflicts is None
        assert check.execute(_ctx())["problems"] == []
        return
    wait_until(lambda: (hook.subscription_errors("diverge_sub").conflicts or {}).get(
        "update_missing"), what="the conflict counted")  # fmt: skip
    ti = FakeTI()
    with pytest.raises(AirflowFailException, match="update_missing conflict") as failure:
        check.execute(_ctx(ti))
    assert "diverged" in str(failure.value)
    assert "pg_stat_reset_subscription_stats" in str(failure.value)  # the counters only grow
    assert ti.pushed["return_value"]["pending_transaction"] is None  # nothing is stuck
    assert ti.pushed["return_value"]["conflicts"]["update_missing"] == 1
    tolerant = SubscriptionErrorCheckOperator(
        task_id="check", subscription="diverge_sub", subscriber_conn_id=pair.sub_conn,
        max_conflicts={"update_missing": 1}, worker_grace_period=10,
    )  # fmt: skip
    assert tolerant.execute(_ctx())["problems"] == []


# -- the toolkit in sequence, then finalize ------------------------------------------------------


def test_fence_catch_up_sync_parity_and_finalize_with_reverse_replication(pair: Pair) -> None:
    pair.both("CREATE TABLE orders (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
              " v text)")  # fmt: skip
    pair.pub("INSERT INTO orders (v) SELECT 'initial' FROM generate_series(1, 1000)")
    _subscribe(pair, "move_pub", "move_sub", ["orders"])
    app, app_pw = pair.role("app")
    pair.pub(sql.SQL("GRANT INSERT, SELECT ON orders TO {}").format(sql.Identifier(app)))
    with pair.connect_as(app, app_pw) as conn:
        conn.execute("INSERT INTO orders (v) SELECT 'live' FROM generate_series(1, 200)")

    fence = WriteFenceOperator(
        task_id="write_fence", postgres_conn_id=pair.pub_conn, roles=[app],
        publication="move_pub", grace_period=1,
    ).execute(_ctx())  # fmt: skip
    sensor = LsnCatchUpSensor(
        task_id="catch_up", subscriber_conn_id=pair.sub_conn, subscription="move_sub",
        target_lsn=fence["fence_lsn"],
    )  # fmt: skip
    wait_until(lambda: sensor.verdict().done, what="subscription at the fence LSN")
    assert pair.sub("SELECT count(*) FROM orders") == [(1200,)]
    synced = SyncSequencesOperator(
        task_id="seq", publisher_conn_id=pair.pub_conn, subscriber_conn_id=pair.sub_conn,
        publication="move_pub",
    ).execute(_ctx())  # fmt: skip
    assert [e["new_value"] for e in synced["sequences"]] == [1200]
    TableParityCheckOperator(
        task_id="parity", publisher_conn_id=pair.pub_conn, subscriber_conn_id=pair.sub_conn,
        publication="move_pub",
    ).execute(_ctx())  # fmt: skip

    slot = pair.sub_hook().get_subscription("move_sub")
    assert slot is not None and slot.slot_name
    finalize = FinalizeCutoverOperator(
        task_id="finalize", subscription="move_sub", subscriber_conn_id=pair.sub_conn,
        publisher_conn_id=pair.pub_conn, reverse_publication="back_pub",
        reverse_subscription="Back ✓ 'sub'",
    )  # fmt: skip
    result = finalize.execute(_ctx())
    assert result["dropped"] is True and result["publisher_slot_present"] is False
    assert slot.slot_name not in {s.name for s in pair.pub_hook().list_slots()}
    assert pair.sub_hook().get_subscription("move_sub") is None
    assert result["reverse_publication"]["action"] == "created"
    assert result["reverse_subscription"]["action"] == "created"

    # The old primary follows the new one: a write there (numbered past the publisher's rows
    # thanks to the sequence sync) arrives back, nothing is copied twice.
    pair.sub("INSERT INTO orders (v) VALUES ('written on the new primary')")
    back = pair.pub_hook()
    wait_until(lambda: pair.pub("SELECT id FROM orders WHERE v = 'written on the new primary'")
               == [(1201,)], what="reverse replication")  # fmt: skip
    assert pair.pub("SELECT count(*) FROM orders") == [(1201,)]
    status = back.subscription_status("Back ✓ 'sub'")
    assert status.exists and status.enabled

    again = finalize.execute(_ctx())  # a re-run changes nothing
    assert again["dropped"] is False
    assert again["reverse_subscription"]["action"] == "unchanged"
    WriteFenceReleaseOperator(task_id="release", postgres_conn_id=pair.pub_conn).execute(_ctx())
