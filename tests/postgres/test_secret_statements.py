"""The publisher's password never reaches the subscriber's server log or statistics.

A subscriber of its own that keeps every statement it can: ``log_statement = all``,
``log_min_duration_statement = 0``, ``pg_stat_statements`` loaded. Creating a subscription as a
superuser leaves the password in neither; a role that cannot turn that keeping off is refused
before the statement is sent. Each assertion failed before ``postgres.secret_statements``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg import sql

from airflow_pglogrepl.exceptions import PasswordExposureError, PrivilegeError
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.postgres.secret_statements import quiet_secret_statements
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, local_cluster

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion

DB = "secret_sub"
KEEPING = {
    **LOGICAL_SETTINGS,
    "shared_preload_libraries": "pg_stat_statements",
    "log_statement": "all",
    "log_min_duration_statement": "0",
    "pg_stat_statements.track": "all",
}


@pytest.fixture(scope="module")
def keeping(publisher: PgCluster) -> Iterator[PgCluster]:
    """The logging subscriber; the shared publisher has a database with a publication."""
    publisher.create_database(DB)
    publisher.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t",
                      dbname=DB)  # fmt: skip
    with local_cluster("keeping", KEEPING) as cluster:
        cluster.create_database(DB)
        cluster.execute("CREATE EXTENSION pg_stat_statements; CREATE TABLE t (id int PRIMARY KEY)",
                        dbname=DB)  # fmt: skip
        cluster.execute("CREATE ROLE app_sub LOGIN PASSWORD 'app-pw'")
        yield cluster
    publisher.execute(f"DROP DATABASE {DB} WITH (FORCE)")


def _kept_anywhere(cluster: PgCluster, secret: str) -> list[str]:
    places = []
    if secret in cluster.logfile.read_text(errors="replace"):
        places.append("server log")
    statements = cluster.execute("SELECT query FROM pg_stat_statements", dbname=DB)
    if any(secret in row[0] for row in statements):
        places.append("pg_stat_statements")
    return places


def test_a_superusers_subscription_keeps_the_password_nowhere(
    keeping: PgCluster, publisher: PgCluster
) -> None:
    hook = DsnReplicationHook(keeping.dsn(DB))
    first, second = "first-Pw:7;'x", "second-Pw\\9"
    publisher.execute(sql.SQL("CREATE ROLE secret_rep LOGIN REPLICATION PASSWORD {}").format(
        sql.Literal(first)))  # fmt: skip
    publisher.execute("GRANT SELECT ON t TO secret_rep", dbname=DB)
    target = {**publisher.params(DB), "user": "secret_rep", "password": first}
    try:
        result = hook.ensure_subscription(
            "secret_sub", publisher_params=target, publications=["p"], options={}
        )
        assert result.action == "created"
        # a changed password is applied in place: ALTER SUBSCRIPTION ... CONNECTION, same rule
        publisher.execute(sql.SQL("ALTER ROLE secret_rep PASSWORD {}").format(
            sql.Literal(second)))  # fmt: skip
        again = hook.ensure_subscription(
            "secret_sub", publisher_params={**target, "password": second}, publications=["p"],
            options={},
        )  # fmt: skip
        assert again.action == "changed"
    finally:
        hook.drop_subscription("secret_sub")
        publisher.execute("REVOKE ALL ON t FROM secret_rep", dbname=DB)
        publisher.execute("DROP ROLE secret_rep")
    for secret in ("first-Pw", "second-Pw"):  # quoted in the statement: look for a prefix
        assert _kept_anywhere(keeping, secret) == []
    assert "CREATE SUBSCRIPTION" not in keeping.logfile.read_text(errors="replace")


def test_a_failing_create_keeps_the_password_nowhere(
    keeping: PgCluster, publisher: PgCluster
) -> None:
    hook = DsnReplicationHook(keeping.dsn(DB))
    wrong = {**publisher.params(DB), "password": "wrong-" + publisher.password}
    with pytest.raises(Exception, match="subscription statement failed") as failed:
        hook.ensure_subscription("secret_bad", publisher_params=wrong, publications=["p"],
                                 options={})  # fmt: skip
    assert "wrong-" not in str(failed.value)
    assert _kept_anywhere(keeping, "wrong-" + publisher.password) == []


def test_a_role_that_cannot_quiet_the_server_sends_nothing(
    keeping: PgCluster, publisher: PgCluster
) -> None:
    """PostgreSQL 15: only superusers create subscriptions; the refusal comes before the
    statement (the server would have logged it, password and all, under log_statement)."""
    params = {**keeping.params(DB), "user": "app_sub", "password": "app-pw"}
    from airflow_pglogrepl.conninfo import make_dsn

    hook = DsnReplicationHook(make_dsn(params))
    with pytest.raises((PrivilegeError, PasswordExposureError), match="Nothing was"):
        hook.ensure_subscription("secret_app", publisher_params=publisher.params(DB),
                                 publications=["p"], options={})  # fmt: skip
    assert _kept_anywhere(keeping, publisher.password) == []


def test_what_a_role_cannot_quiet_is_named_and_a_grant_fixes_it(keeping: PgCluster) -> None:
    from airflow_pglogrepl.postgres.connect import connect

    params = {**keeping.params(DB), "user": "app_sub", "password": "app-pw"}
    with connect(params, label="test") as conn:
        leaks = quiet_secret_statements(conn)
    assert {leak.split(" = ")[0] for leak in leaks} == {
        "log_statement", "log_min_duration_statement", "log_min_error_statement",
        "pg_stat_statements.track",
    }  # fmt: skip
    keeping.execute(
        "GRANT SET ON PARAMETER log_statement, log_min_duration_statement,"
        " log_min_error_statement, pg_stat_statements.track TO app_sub"
    )
    try:
        with connect(params, label="test") as conn:
            assert quiet_secret_statements(conn) == []
            assert conn.execute("SHOW log_statement").fetchone() == {"log_statement": "none"}
    finally:
        keeping.execute(
            "REVOKE SET ON PARAMETER log_statement, log_min_duration_statement,"
            " log_min_error_statement, pg_stat_statements.track FROM app_sub"
        )


def test_a_non_superuser_owns_and_reconciles_its_subscription(
    keeping: PgCluster, publisher: PgCluster
) -> None:
    """PostgreSQL 16+: a member of pg_create_subscription owns subscriptions, but may not read
    pg_subscription.subconninfo. Creating, re-running (reconcile), reading and dropping work;
    before, every read of the definition failed with "permission denied"."""
    from airflow_pglogrepl.conninfo import make_dsn

    if keeping.execute("SHOW server_version_num")[0][0] < "160000":
        pytest.skip("non-superuser subscription owners need PostgreSQL 16+")
    settings = "log_statement, log_min_duration_statement, log_min_error_statement, " \
        "pg_stat_statements.track"  # fmt: skip
    keeping.execute(f"GRANT pg_create_subscription TO app_sub; GRANT SET ON PARAMETER {settings} "
                    f"TO app_sub")  # fmt: skip
    keeping.execute(f"GRANT CREATE ON DATABASE {DB} TO app_sub")
    hook = DsnReplicationHook(make_dsn({**keeping.params(DB), "user": "app_sub",
                                        "password": "app-pw"}))  # fmt: skip
    target = publisher.params(DB)
    try:
        created = hook.ensure_subscription("app_owned", publisher_params=target,
                                           publications=["p"], options={})  # fmt: skip
        assert created.action == "created"
        info = hook.get_subscription("app_owned")
        assert info is not None and info.target is None and info.publications == ("p",)
        again = hook.ensure_subscription("app_owned", publisher_params=target,
                                         publications=["p"], options={"binary": True})  # fmt: skip
        assert again.action == "changed" and again.details == ("binary -> True",)
        # the connection cannot be compared: it is left alone, never applied blindly (another
        # publisher here would have re-pointed the subscription)
        moved = {**target, "host": "192.0.2.1"}
        same = hook.ensure_subscription("app_owned", publisher_params=moved,
                                        publications=["p"], options={"binary": True})  # fmt: skip
        assert same.action == "unchanged"
        assert hook.drop_subscription("app_owned").dropped
    finally:
        keeping.execute("DROP SUBSCRIPTION IF EXISTS app_owned", dbname=DB)
        keeping.execute(f"REVOKE CREATE ON DATABASE {DB} FROM app_sub")
        keeping.execute(f"REVOKE pg_create_subscription FROM app_sub; REVOKE SET ON PARAMETER "
                        f"{settings} FROM app_sub")  # fmt: skip
    assert _kept_anywhere(keeping, publisher.password) == []
