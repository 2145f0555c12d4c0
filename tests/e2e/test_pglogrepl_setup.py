"""Publication -> subscription -> ready -> lag sensors, run in Airflow on live clusters."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.sensors.subscription import SubscriptionReadySensor
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import airflow_cli, run_dag, set_airflow_connection, xcom_value

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion

_ids = itertools.count(1)


@dataclass
class Flow:
    """One publisher database and one subscriber database, with Airflow connections for both."""

    publisher: PgCluster
    pub_db: str
    subscriber: PgCluster
    sub_db: str
    pub_conn: str
    sub_conn: str

    def pub(self, statement: str) -> list[tuple[object, ...]]:
        return self.publisher.execute(statement, dbname=self.pub_db)

    def sub(self, statement: str) -> list[tuple[object, ...]]:
        return self.subscriber.execute(statement, dbname=self.sub_db)

    def both(self, statement: str) -> None:
        self.pub(statement)
        self.sub(statement)

    def params(self, **extra: object) -> dict[str, object]:
        return {"publisher_conn_id": self.pub_conn, "subscriber_conn_id": self.sub_conn, **extra}


def _flow(publisher: PgCluster, subscriber: PgCluster) -> Iterator[Flow]:
    n = next(_ids)
    pub_db, sub_db = f"flow_pub_{n}", f"flow_sub_{n}"
    publisher.create_database(pub_db)
    subscriber.create_database(sub_db)
    set_airflow_connection(f"flow_pub_{n}", publisher.airflow_uri(pub_db))
    set_airflow_connection(f"flow_sub_{n}", subscriber.airflow_uri(sub_db))
    flow = Flow(publisher, pub_db, subscriber, sub_db, f"flow_pub_{n}", f"flow_sub_{n}")
    yield flow
    # Subscriptions hold slots and workers: drop them so the shared clusters stay clean.
    hook = PgLogicalReplicationHook(postgres_conn_id=flow.sub_conn)
    for (name,) in flow.sub("SELECT subname FROM pg_subscription"):
        hook.drop_subscription(str(name))


@pytest.fixture
def flow(publisher: PgCluster, subscriber: PgCluster, airflow_home: object) -> Iterator[Flow]:
    yield from _flow(publisher, subscriber)


@pytest.fixture
def same_instance_flow(publisher: PgCluster, airflow_home: object) -> Iterator[Flow]:
    yield from _flow(publisher, publisher)


def _orders(flow: Flow, rows: int) -> None:
    flow.both("CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric)")
    flow.both("CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL)")
    flow.pub(
        f"INSERT INTO orders SELECT g, 'c' || (g % 97), g * 1.5 FROM generate_series(1, {rows}) g"
    )
    flow.pub("INSERT INTO customers SELECT g, 'n' || g FROM generate_series(1, 100) g")


def _same_rows(flow: Flow, table: str) -> None:
    query = f"SELECT count(*), coalesce(sum(hashtext(t::text)), 0) FROM {table} t"
    assert flow.pub(query) == flow.sub(query)


def _hold_the_copy_for_two_pokes(flow: Flow, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Keep the initial copy of ``orders`` waiting until the ready sensor has poked twice.

    A lock on the subscriber's table stops the table-sync worker before it copies a row; the
    sensor's own second unready poke lets it go, so the test sees the sensor wait however fast
    the machine copies.
    """
    holder = flow.subscriber.connect(flow.sub_db, autocommit=False)
    holder.execute("LOCK TABLE orders IN SHARE MODE")
    unready = 0
    poke = SubscriptionReadySensor.poke

    def counted(sensor: SubscriptionReadySensor, context: Any) -> Any:
        nonlocal unready
        result = poke(sensor, context)
        if not getattr(result, "is_done", result):
            unready += 1
            if unready == 2:
                holder.rollback()
        return result

    monkeypatch.setattr(SubscriptionReadySensor, "poke", counted)
    return holder


def test_setup_dag_replicates_and_is_idempotent(
    flow: Flow, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _orders(flow, 20_000)
    conf = flow.params(tables=["orders"])
    holder = _hold_the_copy_for_two_pokes(flow, monkeypatch)
    try:
        run = run_dag("pglogrepl_setup", conf)
    finally:
        holder.close()
    assert run.state == "success"  # type: ignore[attr-defined]
    log = capfd.readouterr().out
    assert log.count("waiting for public.orders") >= 2, "the sensor did not wait for the copy"
    _same_rows(flow, "orders")
    ready = xcom_value("pglogrepl_setup", run.run_id, "wait_ready")  # type: ignore[attr-defined]
    assert isinstance(ready, dict)
    assert ready["state_counts"] == {"r": 1}
    lag = xcom_value("pglogrepl_setup", run.run_id, "wait_lag")  # type: ignore[attr-defined]
    assert isinstance(lag, dict) and lag["lag_bytes"] <= 1024 * 1024

    # Same definition again: every task succeeds and changes nothing.
    again = run_dag("pglogrepl_setup", conf)
    assert again.state == "success"  # type: ignore[attr-defined]
    for task in ("create_publication", "create_subscription"):
        result = xcom_value("pglogrepl_setup", again.run_id, task)  # type: ignore[attr-defined]
        assert isinstance(result, dict) and result["action"] == "unchanged", result

    # A changed table list is reconciled: the new table is published, subscribed and copied.
    flow.pub("INSERT INTO orders VALUES (20001, 'late', 1)")
    grown = run_dag("pglogrepl_setup", flow.params(tables=["orders", "customers"]))
    assert grown.state == "success"  # type: ignore[attr-defined]
    result = xcom_value("pglogrepl_setup", grown.run_id, "create_publication")  # type: ignore[attr-defined]
    assert isinstance(result, dict) and result["details"] == ["+ public.customers"]
    sub_result = xcom_value("pglogrepl_setup", grown.run_id, "create_subscription")  # type: ignore[attr-defined]
    assert isinstance(sub_result, dict) and sub_result["action"] == "unchanged"
    hook = PgLogicalReplicationHook(postgres_conn_id=flow.sub_conn)
    hook.refresh_subscription("flow_sub")
    from airflow_pglogrepl.testing.wait import wait_until

    wait_until(lambda: flow.sub("SELECT count(*) FROM customers") == [(100,)], what="customers")
    wait_until(lambda: flow.sub("SELECT count(*) FROM orders") == [(20_001,)], what="late order")
    _same_rows(flow, "customers")


def test_same_instance_two_databases(same_instance_flow: Flow) -> None:
    flow = same_instance_flow
    _orders(flow, 20_000)
    run = run_dag("pglogrepl_setup", flow.params(tables=["orders", "customers"]))
    assert run.state == "success"  # type: ignore[attr-defined]
    result = xcom_value("pglogrepl_setup", run.run_id, "create_subscription")  # type: ignore[attr-defined]
    assert isinstance(result, dict) and result["same_instance"] is True
    _same_rows(flow, "orders")
    _same_rows(flow, "customers")


def test_deferrable_sensors(flow: Flow) -> None:
    _orders(flow, 50_000)
    run = run_dag("pglogrepl_setup_deferrable", flow.params(tables=["orders"]))
    assert run.state == "success"  # type: ignore[attr-defined]
    ready = xcom_value("pglogrepl_setup_deferrable", run.run_id, "wait_ready")  # type: ignore[attr-defined]
    assert isinstance(ready, dict) and ready["state_counts"] == {"r": 1}
    lag = xcom_value("pglogrepl_setup_deferrable", run.run_id, "wait_lag")  # type: ignore[attr-defined]
    assert isinstance(lag, dict) and "lag_bytes" in lag
    _same_rows(flow, "orders")


def test_hostile_names_end_to_end(flow: Flow) -> None:
    table = '"Ordërs; ""quoted"" tbl"'
    flow.both(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    flow.pub(f"INSERT INTO {table} SELECT g, md5(g::text) FROM generate_series(1, 1000) g")
    conf = flow.params(
        tables=[f"public.{table}"], publication='pub "x"; drop', subscription="Sub ✓ 'y'"
    )
    run = run_dag("pglogrepl_setup", conf)
    assert run.state == "success"  # type: ignore[attr-defined]
    _same_rows(flow, f"public.{table}")


def test_wrong_password_is_clear_and_never_logged(
    flow: Flow, publisher: PgCluster, capfd: pytest.CaptureFixture[str]
) -> None:
    wrong = "Wr0ng-pa55word-" + "x" * 8
    set_airflow_connection(
        "flow_bad_pub", publisher.airflow_uri(flow.pub_db).replace(publisher.password, wrong)
    )
    flow.both("CREATE TABLE t_pw (id int PRIMARY KEY)")
    conf = {"publisher_conn_id": "flow_bad_pub", "subscriber_conn_id": flow.sub_conn,
            "tables": ["t_pw"]}  # fmt: skip
    result = airflow_cli("dags", "test", "pglogrepl_setup", "-c", json.dumps(conf))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "password authentication failed" in output
    assert "flow_bad_pub" in output  # names the Airflow connection to fix
    assert wrong not in output
    assert publisher.password not in output


def test_ready_sensor_fails_fast_on_a_sync_error(flow: Flow) -> None:
    _orders(flow, 1000)
    flow.sub("INSERT INTO orders VALUES (7, 'already here', 0)")  # the copy will hit this key
    hook = PgLogicalReplicationHook(postgres_conn_id=flow.sub_conn)
    from airflow_pglogrepl.operators.publication import CreatePublicationOperator
    from airflow_pglogrepl.operators.subscription import CreateSubscriptionOperator

    CreatePublicationOperator(
        task_id="p", publication="flow_pub", postgres_conn_id=flow.pub_conn, tables=["orders"]
    ).execute({})  # type: ignore[arg-type]
    CreateSubscriptionOperator(
        task_id="s", subscription="flow_sub", publications=["flow_pub"],
        publisher_conn_id=flow.pub_conn, subscriber_conn_id=flow.sub_conn,
    ).execute({})  # type: ignore[arg-type]  # fmt: skip
    started = time.monotonic()
    run = run_dag("pglogrepl_ready_only", flow.params())
    elapsed = time.monotonic() - started
    assert run.state == "failed"  # type: ignore[attr-defined]
    assert elapsed < 120, f"took {elapsed:.0f}s: the sensor waited instead of failing fast"
    status = hook.subscription_status("flow_sub")
    assert (status.sync_error_count or 0) >= 2
    assert [str(rel.table) for rel in status.not_ready] == ["public.orders"]


def test_subscription_password_stays_out_of_errors_and_server_log(
    flow: Flow, publisher: PgCluster, subscriber: PgCluster
) -> None:
    from airflow_pglogrepl.exceptions import PgLogReplError

    flow.both("CREATE TABLE t_pw2 (id int PRIMARY KEY)")
    flow.pub("CREATE PUBLICATION pw_pub FOR TABLE t_pw2")
    wrong = "S3cret-" + "q" * 12
    params = publisher.params(flow.pub_db)
    params["password"] = wrong
    hook = PgLogicalReplicationHook(postgres_conn_id=flow.sub_conn)
    with pytest.raises(PgLogReplError) as info:
        hook.ensure_subscription(
            "pw_sub", publisher_params=params, publications=["pw_pub"], options={}
        )
    assert "password authentication failed" in str(info.value)
    assert wrong not in str(info.value)
    assert wrong not in repr(info.value.__cause__) and info.value.__cause__ is None
    assert wrong not in subscriber.logfile.read_text(errors="replace")
    assert hook.get_subscription("pw_sub") is None
