"""ReplicationPreflightOperator and the catalog hook against the live publisher and subscriber.

Each test works in its own schema of two databases of its own (``preflight_pub`` on the
publisher, ``preflight_sub`` on the subscriber), so the shared clusters stay clean.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException
from psycopg import sql

from airflow_pglogrepl.boundary import raised_error
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.operators.preflight import ReplicationPreflightOperator
from airflow_pglogrepl.preflight import PreflightFailedError, ReplicaIdentityChangeError
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import run_dag, set_airflow_connection, xcom_value
from tests.support.boundary import task_fails_with

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion

PUB_DB, SUB_DB = "preflight_pub", "preflight_sub"
PUB_CONN, SUB_CONN = "preflight_pub", "preflight_sub"
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def databases(publisher: PgCluster, subscriber: PgCluster) -> None:
    publisher.create_database(PUB_DB)
    subscriber.create_database(SUB_DB)
    set_airflow_connection(PUB_CONN, publisher.airflow_uri(PUB_DB))
    set_airflow_connection(SUB_CONN, subscriber.airflow_uri(SUB_DB))


@dataclass
class Sandbox:
    """A schema of the same name in both test databases."""

    schema: str
    publisher: PgCluster
    subscriber: PgCluster

    def pub(self, statement: Any, params: Any = None) -> list[Any]:
        return self.publisher.execute(statement, params, dbname=PUB_DB)

    def sub(self, statement: Any, params: Any = None) -> list[Any]:
        return self.subscriber.execute(statement, params, dbname=SUB_DB)

    def both(self, statement: Any) -> None:
        self.pub(statement)
        self.sub(statement)

    def t(self, name: str) -> str:
        """``schema.name`` as text a DAG author would write."""
        return f"{self.schema}.{name}"

    def identity(self, name: str) -> str:
        rows = self.pub(
            "SELECT relreplident::text FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE nspname = %s AND relname = %s",
            (self.schema, name),
        )
        return str(rows[0][0])


@pytest.fixture
def box(databases: None, publisher: PgCluster, subscriber: PgCluster) -> Iterator[Sandbox]:
    sandbox = Sandbox(f"pf{next(_ids)}", publisher, subscriber)
    sandbox.both(f"CREATE SCHEMA {sandbox.schema}")
    try:
        yield sandbox
    finally:
        sandbox.both(f"DROP SCHEMA {sandbox.schema} CASCADE")


class FakeTI:
    """Collects what the operator pushes to XCom."""

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = json.loads(json.dumps(value))  # what XCom would store


@dataclass
class Outcome:
    report: dict[str, Any]  # the XCom "report"
    returned: dict[str, Any] | None
    error: PreflightFailedError | None

    def checks(self) -> dict[str | None, set[str]]:
        """Check names found, by table (``None``: server-wide)."""
        out: dict[str | None, set[str]] = {}
        for finding in self.report["problems"] + self.report["warnings"]:
            out.setdefault(finding["table"], set()).add(finding["check"])
        return out


def preflight(**kwargs: Any) -> Outcome:
    kwargs.setdefault("publisher_conn_id", PUB_CONN)
    kwargs.setdefault("subscriber_conn_id", SUB_CONN)
    operator = ReplicationPreflightOperator(task_id="preflight", **kwargs)
    ti = FakeTI()
    try:
        returned = operator.execute({"ti": ti})  # type: ignore[arg-type]
    except AirflowFailException as failed:  # no retry can help: the task fails at once
        error = raised_error(failed)
        assert isinstance(error, PreflightFailedError), repr(error)
        return Outcome(ti.xcom["report"], None, error)
    assert returned == ti.xcom["report"]
    return Outcome(ti.xcom["report"], returned, None)


# -- the operator -----------------------------------------------------------------------------


def test_a_sound_table_set_passes(box: Sandbox) -> None:
    box.both(f"CREATE TABLE {box.t('orders')} (id bigint PRIMARY KEY, note text)")
    box.both(
        f"CREATE TABLE {box.t('events')} (id int, at date, PRIMARY KEY (id, at))"
        f" PARTITION BY RANGE (at);"
        f" CREATE TABLE {box.t('events_2024')} PARTITION OF {box.t('events')}"
        f" FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')"
    )
    outcome = preflight(tables=[box.t("orders"), box.t("events")])
    report = outcome.report
    assert outcome.error is None and report["ok"] is True, report["summary"]
    assert report["problems"] == [] and report["warnings"] == []
    tables = report["tables"]
    assert tables[box.t("orders")]["identity_class"] == "primary_key"
    assert tables[box.t("orders")]["identity_columns"] == ["id"]
    assert tables[box.t("orders")]["on_subscriber"] is True
    assert tables[box.t("events")]["identity_class"] == "partitioned"
    assert tables[box.t("events_2024")]["partition_of"] == box.t("events")
    assert tables[box.t("events_2024")]["identity_class"] == "primary_key"
    pub_facts = PgLogicalReplicationHook(postgres_conn_id=PUB_CONN).server_facts()
    capacity = report["capacity"]
    assert capacity["publisher"]["max_replication_slots"] == pub_facts.max_replication_slots
    assert capacity["publisher"]["needed"] == 3  # 1 apply + min(4 sync, 2 tables)
    assert "nothing blocks replication" in report["summary"]


def test_every_blocking_problem_is_named_in_one_failure(box: Sandbox) -> None:
    s = box.schema
    box.pub(f"CREATE TABLE {s}.missing_on_sub (id int PRIMARY KEY)")
    box.pub(f"CREATE TABLE {s}.missing_col (id int PRIMARY KEY, a text, b int)")
    box.sub(f"CREATE TABLE {s}.missing_col (id int PRIMARY KEY, a text)")
    box.pub(f"CREATE TABLE {s}.sub_not_null (id int PRIMARY KEY, v text)")
    box.sub(f"CREATE TABLE {s}.sub_not_null (id int PRIMARY KEY, v text, must int NOT NULL)")
    box.both(f"CREATE TABLE {s}.no_key (a int, b text)")
    box.both(f"CREATE TABLE {s}.ident_nothing (id int PRIMARY KEY, v text)")
    box.pub(f"ALTER TABLE {s}.ident_nothing REPLICA IDENTITY NOTHING")
    box.both(f"CREATE TABLE {s}.nullable_uniq (a int UNIQUE, b text)")
    box.pub(f"CREATE TABLE {s}.sub_without_key (id int PRIMARY KEY, v text)")
    box.sub(f"CREATE TABLE {s}.sub_without_key (id int, v text)")
    box.both(f"CREATE TABLE {s}.fine (id int PRIMARY KEY)")
    names = [
        "missing_on_sub",
        "missing_col",
        "sub_not_null",
        "no_key",
        "ident_nothing",
        "nullable_uniq",
        "sub_without_key",
        "fine",
    ]
    outcome = preflight(tables=[box.t(n) for n in names])

    assert outcome.error is not None and outcome.returned is None
    assert outcome.report["ok"] is False
    assert outcome.checks() == {
        box.t("missing_on_sub"): {"table_missing_on_subscriber"},
        box.t("missing_col"): {"column_missing"},
        box.t("sub_not_null"): {"not_null_without_default"},
        box.t("no_key"): {"identity_no_key"},
        box.t("ident_nothing"): {"identity_nothing"},
        box.t("nullable_uniq"): {"identity_nullable_unique_index"},
        box.t("sub_without_key"): {"subscriber_key_mismatch"},
    }
    message = str(outcome.error)
    assert message == outcome.report["summary"]
    assert "7 problems block replication" in message
    for problem in outcome.report["problems"]:
        assert f"{problem['table']}: {problem['message']} Fix: {problem['fix']}" in message
    assert f'ALTER TABLE {s}.missing_col ADD COLUMN "b" integer' in message
    assert f'ALTER TABLE {s}.sub_not_null ALTER COLUMN "must" SET DEFAULT' in message
    assert f"ALTER TABLE {s}.ident_nothing REPLICA IDENTITY DEFAULT" in message
    assert 'cannot be used as replica identity because column "a" is nullable' in message
    assert f"ALTER TABLE {s}.no_key REPLICA IDENTITY FULL" in message
    assert outcome.report["tables"][box.t("fine")]["problems"] == []


def test_fix_replica_identity_repairs_what_it_can(box: Sandbox) -> None:
    s = box.schema
    box.both(
        f"CREATE TABLE {s}.uniq_nn (a int NOT NULL, b int NOT NULL, c text, UNIQUE (a, b));"
        f" CREATE UNIQUE INDEX uniq_nn_a ON {s}.uniq_nn (a)"
    )
    box.sub(f"ALTER TABLE {s}.uniq_nn REPLICA IDENTITY USING INDEX uniq_nn_a")
    box.both(f"CREATE TABLE {s}.nothing_pk (id int PRIMARY KEY)")
    box.pub(f"ALTER TABLE {s}.nothing_pk REPLICA IDENTITY NOTHING")
    box.both(f"CREATE TABLE {s}.full_pk (id int PRIMARY KEY)")
    box.pub(f"ALTER TABLE {s}.full_pk REPLICA IDENTITY FULL")
    box.pub(
        f"CREATE TABLE {s}.gone (a int NOT NULL, b int NOT NULL);"
        f" CREATE UNIQUE INDEX gone_a ON {s}.gone (a); CREATE UNIQUE INDEX gone_b ON {s}.gone (b);"
        f" ALTER TABLE {s}.gone REPLICA IDENTITY USING INDEX gone_a; DROP INDEX {s}.gone_a"
    )
    box.sub(f"CREATE TABLE {s}.gone (a int NOT NULL, b int PRIMARY KEY)")
    box.both(f"CREATE TABLE {s}.no_key (a int)")
    box.both(f"CREATE TABLE {s}.nullable_uniq (a int UNIQUE)")
    tables = [box.t(n) for n in ("uniq_nn", "nothing_pk", "full_pk", "gone", "no_key")]
    tables.append(box.t("nullable_uniq"))
    assert box.identity("gone") == "i"

    indexed = preflight(tables=tables, fix_replica_identity="index")
    applied = {fix["table"]: fix for fix in indexed.report["fixes_applied"]}
    assert set(applied) == {box.t(n) for n in ("uniq_nn", "nothing_pk", "full_pk", "gone")}
    assert applied[box.t("uniq_nn")]["statement"] == (
        f'ALTER TABLE {s}.uniq_nn REPLICA IDENTITY USING INDEX "uniq_nn_a"'
    )
    assert (applied[box.t("uniq_nn")]["before"], applied[box.t("uniq_nn")]["after"]) == (
        "unique_index_unused",
        "index",
    )
    assert (applied[box.t("nothing_pk")]["before"], applied[box.t("nothing_pk")]["after"]) == (
        "nothing",
        "primary_key",
    )
    assert applied[box.t("full_pk")]["after"] == "primary_key"
    assert applied[box.t("gone")]["statement"].endswith('USING INDEX "gone_b"')
    assert [box.identity(n) for n in ("uniq_nn", "nothing_pk", "full_pk", "gone")] == list("iddi")
    assert indexed.error is not None  # what index mode cannot fix still fails, and says why
    assert indexed.checks() == {
        box.t("no_key"): {"identity_no_key"},
        box.t("nullable_uniq"): {"identity_nullable_unique_index"},
    }
    assert "Replica identity changed:" in str(indexed.error)

    full = preflight(tables=tables, fix_replica_identity="full")
    assert full.error is None, full.report["summary"]
    assert {(f["table"], f["before"], f["after"]) for f in full.report["fixes_applied"]} == {
        (box.t("no_key"), "no_key", "full"),
        (box.t("nullable_uniq"), "nullable_unique_index", "full"),
    }
    assert box.identity("no_key") == box.identity("nullable_uniq") == "f"
    assert full.checks() == {
        box.t("no_key"): {"identity_full"},
        box.t("nullable_uniq"): {"identity_full"},
    }

    strict = preflight(tables=tables, fix_replica_identity="full", fail_on_warnings=True)
    assert strict.report["fixes_applied"] == []  # nothing left to change
    assert strict.error is not None and "fail_on_warnings=True" in str(strict.error)


@pytest.fixture
def app_role(box: Sandbox, publisher: PgCluster) -> Iterator[str]:
    """A login role without REPLICATION, and an Airflow connection for it."""
    role, password = f"pf_app_{box.schema}", "app-secret-1"
    publisher.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    set_airflow_connection(
        "preflight_app", f"postgres://{role}:{password}@{publisher.host}:{publisher.port}/{PUB_DB}"
    )
    try:
        yield role
    finally:
        publisher.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)), dbname=PUB_DB)
        publisher.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_role_without_replication_or_select(box: Sandbox, app_role: str) -> None:
    s = box.schema
    box.both(f"CREATE TABLE {s}.granted (id int PRIMARY KEY)")
    box.both(f"CREATE TABLE {s}.secret (id int PRIMARY KEY)")
    box.both(f"CREATE TABLE {s}.no_key (a int)")
    box.pub(f"GRANT USAGE ON SCHEMA {s} TO {app_role}; GRANT SELECT ON {s}.granted TO {app_role}")
    box.pub(f"GRANT SELECT ON {s}.no_key TO {app_role}")
    box.both(f"CREATE SCHEMA {s}_closed; CREATE TABLE {s}_closed.hidden (id int PRIMARY KEY)")
    try:
        outcome = preflight(
            publisher_conn_id="preflight_app",
            tables=[box.t("granted"), box.t("secret"), f"{s}_closed.hidden", box.t("no_key")],
            fix_replica_identity="full",
        )
    finally:
        box.both(f"DROP SCHEMA {s}_closed CASCADE")
    assert outcome.checks() == {
        None: {"replication_role"},
        box.t("secret"): {"select_privilege"},
        f"{s}_closed.hidden": {"select_privilege", "schema_usage"},
        box.t("no_key"): {"identity_no_key", "identity_fix_failed"},  # not the owner
    }
    problems = {(p["check"], p["table"]): p for p in outcome.report["problems"]}
    assert problems["replication_role", None]["fix"].startswith(
        f'ALTER ROLE "{app_role}" REPLICATION'
    )
    assert problems["select_privilege", box.t("secret")]["fix"] == (
        f'GRANT SELECT ON {s}.secret TO "{app_role}"'
    )
    failed = next(w for w in outcome.report["warnings"] if w["check"] == "identity_fix_failed")
    assert "must be owner" in failed["message"] and "owner" in failed["fix"]
    assert outcome.report["fixes_applied"] == []


def test_capacity_counts_planned_subscriptions_and_slots_in_use(box: Sandbox) -> None:
    box.both(f"CREATE TABLE {box.t('a')} (id int PRIMARY KEY)")
    box.both(f"CREATE TABLE {box.t('b')} (id int PRIMARY KEY)")
    hook = PgLogicalReplicationHook(postgres_conn_id=PUB_CONN)
    hook.create_logical_slot(f"{box.schema}_held")
    try:
        in_use = len(hook.list_slots(logical_only=False))
        outcome = preflight(tables=[box.t("a"), box.t("b")], planned_subscriptions=20)
    finally:
        hook.drop_slot(f"{box.schema}_held")
    assert outcome.checks() == {
        None: {
            "max_replication_slots",
            "max_wal_senders",
            "max_logical_replication_workers",
            "replication_origins",
        }
    }
    capacity = outcome.report["capacity"]
    assert capacity["publisher"]["replication_slots_in_use"] == in_use >= 1
    assert capacity["publisher"]["needed"] == 60  # 20 x (1 apply + min(4 sync, 2 tables))
    slots = next(p for p in outcome.report["problems"] if p["check"] == "max_replication_slots")
    free = capacity["publisher"]["max_replication_slots"] - in_use
    assert f"leaving {free} free; 60 needed" in slots["message"]
    assert f"raise max_replication_slots by {60 - free} to {32 + 60 - free}" in slots["fix"]


HOSTILE_SCHEMA = 'Sales "EU" ü'
HOSTILE_TABLE = "Q1 report; drop table x"
HOSTILE_INDEX = 'idx "odd" ü'
HOSTILE_PUB = 'pub "odd" ü'


def test_hostile_names_work_end_to_end(databases: None, box: Sandbox) -> None:
    table = sql.Identifier(HOSTILE_SCHEMA, HOSTILE_TABLE)
    create = sql.SQL(
        "CREATE SCHEMA {schema}; CREATE TABLE {table} ({id} int NOT NULL, {col} text);"
        " CREATE UNIQUE INDEX {index} ON {table} ({id})"
    ).format(
        schema=sql.Identifier(HOSTILE_SCHEMA),
        table=table,
        id=sql.Identifier("Order Id"),
        col=sql.Identifier('naïve "col"'),
        index=sql.Identifier(HOSTILE_INDEX),
    )
    box.both(create)
    box.sub(sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX {}").format(
        table, sql.Identifier(HOSTILE_INDEX)))  # fmt: skip
    box.pub(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(HOSTILE_PUB), table)
    )
    box.pub(sql.SQL("INSERT INTO {} VALUES (1, 'a')").format(table))
    update = sql.SQL("UPDATE {} SET {} = 'b'").format(table, sql.Identifier('naïve "col"'))
    try:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="replica identity"):
            box.pub(update)  # published without an identity: the publisher refuses updates

        outcome = preflight(publication=HOSTILE_PUB, fix_replica_identity="index")

        key = '"Sales ""EU"" ü"."Q1 report; drop table x"'
        assert str(TableRef(HOSTILE_SCHEMA, HOSTILE_TABLE)) == key
        assert outcome.error is None, outcome.report["summary"]
        assert list(outcome.report["tables"]) == [key]
        assert outcome.report["publication"] == HOSTILE_PUB
        [fix] = outcome.report["fixes_applied"]
        assert fix["statement"] == f'ALTER TABLE {key} REPLICA IDENTITY USING INDEX "idx ""odd"" ü"'
        assert outcome.report["tables"][key]["identity_columns"] == ["Order Id"]
        box.pub(update)  # now it replicates
    finally:
        box.pub(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(HOSTILE_PUB)))
        box.both(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(HOSTILE_SCHEMA)))


def test_publication_tables_and_given_tables(box: Sandbox) -> None:
    box.both(f"CREATE TABLE {box.t('in_pub')} (id int PRIMARY KEY)")
    box.both(f"CREATE TABLE {box.t('extra')} (id int PRIMARY KEY)")
    pub_name = f"{box.schema}_pub"
    box.pub(f"CREATE PUBLICATION {pub_name} FOR TABLE {box.t('in_pub')}")
    try:
        both = preflight(publication=pub_name, tables=[box.t("extra")])
        assert list(both.report["tables"]) == [box.t("extra"), box.t("in_pub")]
        assert both.error is None
    finally:
        box.pub(f"DROP PUBLICATION {pub_name}")
    planned = preflight(publication=pub_name, tables=[box.t("extra")])  # not created yet
    assert planned.error is None and list(planned.report["tables"]) == [box.t("extra")]
    nothing = preflight(publication=pub_name)
    assert nothing.checks() == {None: {"publication_missing"}}


def test_operator_arguments_are_checked_early() -> None:
    with pytest.raises(ValueError, match="publication=, tables="):
        ReplicationPreflightOperator(task_id="p", publisher_conn_id="a", subscriber_conn_id="b")
    with pytest.raises(ValueError, match="'none', 'index', 'full'"):
        ReplicationPreflightOperator(
            task_id="p", publisher_conn_id="a", subscriber_conn_id="b", tables=["t"],
            fix_replica_identity="yes",
        )  # fmt: skip
    with pytest.raises(ValueError, match="at least 1"):
        ReplicationPreflightOperator(
            task_id="p", publisher_conn_id="a", subscriber_conn_id="b", tables=["t"],
            planned_subscriptions=0,
        )  # fmt: skip


# -- the hook ---------------------------------------------------------------------------------


@pytest.fixture
def pub_hook(databases: None) -> PgLogicalReplicationHook:
    return PgLogicalReplicationHook(postgres_conn_id=PUB_CONN)


def test_table_facts_read_every_detail_in_one_batch(
    box: Sandbox, pub_hook: PgLogicalReplicationHook
) -> None:
    s = box.schema
    box.pub(
        f"CREATE TABLE {s}.t (id int GENERATED ALWAYS AS IDENTITY, code text NOT NULL,"
        f" maybe int, twice int GENERATED ALWAYS AS (maybe * 2) STORED, note text DEFAULT 'x',"
        f" CONSTRAINT t_pk PRIMARY KEY (id));"
        f" CREATE UNIQUE INDEX t_inc ON {s}.t (code) INCLUDE (maybe);"
        f" CREATE UNIQUE INDEX t_partial ON {s}.t (code) WHERE maybe > 0;"
        f" CREATE UNIQUE INDEX t_expr ON {s}.t (lower(code));"
        f" CREATE UNIQUE INDEX t_nullable ON {s}.t (code, maybe);"
        f" CREATE INDEX t_plain ON {s}.t (maybe);"
        f" CREATE VIEW {s}.v AS SELECT 1 AS one;"
        f" CREATE UNLOGGED TABLE {s}.u (id int)"
    )
    refs = [TableRef(s, n) for n in ("t", "v", "u", "absent")]
    facts = pub_hook.table_facts(refs)
    assert set(facts) == {TableRef(s, "t"), TableRef(s, "v"), TableRef(s, "u")}
    t = facts[TableRef(s, "t")]
    assert (t.relkind, t.persistence, t.replica_identity) == ("r", "p", "d")
    assert [(c.name, c.type, c.not_null) for c in t.columns] == [
        ("id", "integer", True),
        ("code", "text", True),
        ("maybe", "integer", False),
        ("twice", "integer", False),
        ("note", "text", False),
    ]
    columns = {c.name: c for c in t.columns}
    assert columns["id"].identity == "a" and columns["twice"].generated == "s"
    assert columns["note"].has_default and not columns["maybe"].has_default
    indexes = {i.name: i for i in t.indexes}
    assert set(indexes) == {"t_pk", "t_inc", "t_partial", "t_expr", "t_nullable"}  # unique only
    assert indexes["t_pk"].primary and indexes["t_pk"].columns == ("id",)
    assert indexes["t_inc"].columns == ("code",) and indexes["t_inc"].usable  # INCLUDE left out
    assert indexes["t_partial"].partial and not indexes["t_partial"].usable
    assert indexes["t_expr"].expression and indexes["t_expr"].columns == ()
    assert indexes["t_nullable"].nullable_columns == ("maybe",)
    assert facts[TableRef(s, "v")].kind == "view"
    assert facts[TableRef(s, "u")].persistence == "u"
    assert t.can_select and t.can_use_schema


def test_set_replica_identity_and_its_errors(
    box: Sandbox, pub_hook: PgLogicalReplicationHook, publisher: PgCluster
) -> None:
    s = box.schema
    box.pub(f"CREATE TABLE {s}.t (a int NOT NULL, b int); CREATE UNIQUE INDEX t_a ON {s}.t (a)")
    ref = TableRef(s, "t")
    pub_hook.set_replica_identity(ref, "index", "t_a")
    assert box.identity("t") == "i"
    pub_hook.set_replica_identity(ref, "full")
    assert box.identity("t") == "f"
    with pytest.raises(ValueError, match="index name"):
        pub_hook.set_replica_identity(ref, "index")
    with pytest.raises(ValueError, match="'default', 'full', 'nothing'"):
        pub_hook.set_replica_identity(ref, "DEFAULT; DROP TABLE x")
    with pytest.raises(ReplicaIdentityChangeError, match="does not exist") as missing:
        pub_hook.set_replica_identity(ref, "index", "no_such_index")
    assert missing.value.table == ref
    with publisher.connect(PUB_DB, autocommit=False) as holder:
        holder.execute(f"LOCK TABLE {s}.t IN ACCESS SHARE MODE")
        with pytest.raises(ReplicaIdentityChangeError, match="lock_timeout") as locked:
            pub_hook.set_replica_identity(ref, "default", lock_timeout="50ms")
        holder.rollback()
    assert "pg_stat_activity" in str(locked.value)
    assert box.identity("t") == "f"  # unchanged


def test_usage_counts(
    box: Sandbox, subscriber: PgCluster, publisher: PgCluster, pub_hook: PgLogicalReplicationHook
) -> None:
    sub_hook = PgLogicalReplicationHook(postgres_conn_id=SUB_CONN)
    before = sub_hook.subscriber_usage()
    name = f"{box.schema}_sub"
    dsn = publisher.dsn(PUB_DB).replace("'", "\\'")
    box.sub(
        f"CREATE SUBSCRIPTION {name} CONNECTION '{dsn}' PUBLICATION no_pub WITH (connect = false)"
    )
    try:
        after = sub_hook.subscriber_usage()
    finally:
        box.sub(f"ALTER SUBSCRIPTION {name} SET (slot_name = NONE); DROP SUBSCRIPTION {name}")
    assert after.subscriptions == before.subscriptions + 1
    assert after.enabled_subscriptions == before.enabled_subscriptions  # connect=false: disabled
    usage = pub_hook.publisher_usage()
    assert usage.slots_in_use == len(pub_hook.list_slots(logical_only=False))
    assert usage.wal_senders_in_use >= 0
    role = pub_hook.role_facts()
    assert role.superuser and role.name == publisher.superuser


# -- in a real Airflow run --------------------------------------------------------------------


def test_the_dag_pushes_the_report_and_fails_with_the_summary(
    airflow_home: object, box: Sandbox
) -> None:
    box.both(f"CREATE TABLE {box.t('ok')} (id int PRIMARY KEY)")
    box.pub(f"CREATE TABLE {box.t('only_here')} (id int PRIMARY KEY)")
    conf = {"publisher_conn_id": PUB_CONN, "subscriber_conn_id": SUB_CONN}

    good = run_dag("pglogrepl_preflight", {**conf, "tables": [box.t("ok")]})
    assert good.state == "success"  # type: ignore[attr-defined]
    report = xcom_value("pglogrepl_preflight", good.run_id, "preflight", key="report")  # type: ignore[attr-defined]
    assert isinstance(report, dict) and report["ok"] is True
    assert list(report["tables"]) == [box.t("ok")]
    returned = xcom_value("pglogrepl_preflight", good.run_id, "preflight")  # type: ignore[attr-defined]
    assert returned == report

    bad = run_dag("pglogrepl_preflight", {**conf, "tables": [box.t("ok"), box.t("only_here")]})
    assert bad.state == "failed"  # type: ignore[attr-defined]
    report = xcom_value("pglogrepl_preflight", bad.run_id, "preflight", key="report")  # type: ignore[attr-defined]
    assert isinstance(report, dict) and report["ok"] is False
    assert [(p["table"], p["check"]) for p in report["problems"]] == [
        (box.t("only_here"), "table_missing_on_subscriber")
    ]


def test_a_fix_that_only_a_lock_held_up_lets_the_task_retry(
    box: Sandbox, publisher: PgCluster
) -> None:
    s = box.schema
    box.both(f"CREATE TABLE {s}.busy (id int PRIMARY KEY)")
    box.pub(f"ALTER TABLE {s}.busy REPLICA IDENTITY NOTHING")
    operator = ReplicationPreflightOperator(
        task_id="preflight", publisher_conn_id=PUB_CONN, subscriber_conn_id=SUB_CONN,
        tables=[box.t("busy")], fix_replica_identity="index", lock_timeout="50ms",
    )  # fmt: skip
    with publisher.connect(PUB_DB, autocommit=False) as holder:
        holder.execute(f"LOCK TABLE {s}.busy IN ACCESS SHARE MODE")
        # retryable: the boundary lets it through to Airflow's retries, not AirflowFailException
        with pytest.raises(PreflightFailedError, match="lock_timeout") as locked:
            operator.execute({"ti": FakeTI()})  # type: ignore[arg-type]
        holder.rollback()
    assert locked.value.retryable and box.identity("busy") == "n"
    operator.execute({"ti": FakeTI()})  # type: ignore[arg-type]  # the retry, lock gone
    assert box.identity("busy") == "d"
    # a problem no lock explains still fails the task at once
    box.both(f"CREATE TABLE {s}.keyless (a int)")
    operator.tables = [box.t("busy"), box.t("keyless")]
    with task_fails_with(PreflightFailedError, match="keyless"):
        operator.execute({"ti": FakeTI()})  # type: ignore[arg-type]
