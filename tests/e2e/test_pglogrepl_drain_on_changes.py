"""The incremental-drain DAG scheduled on the slot's changes (``PGLOGREPL_DRAIN_SCHEDULE=changes``)
under a real scheduler and triggerer: one drain run per burst of published changes, none while
the database is idle, and the report DAG only after the drains that changed its table.

As a user starts it: the DAG deployed with no slot yet (the trigger watches a missing slot and
fires nothing), one manual run that bootstraps it (the initial snapshot creates the slot), then
the trigger alone. The tables are small: the snapshot and the drain run in the worker's Python
(a local Spark master, ``operators._in_worker``) and no JVM starts, which the drain's XCom shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.airflow_services import AirflowServices, Run, running_airflow
from tests.support.drain import lake_rows, source_rows
from tests.support.paths import REPO

pytestmark = [pytest.mark.airflow, pytest.mark.live]

DB = "drain_on_changes"
SLOT = "lake_on_changes"
PUBLICATION = "lake_on_changes_pub"
DRAIN = "pglogrepl_incremental_drain"
REPORT = "pglogrepl_table_report"
ACCOUNTS = TableRef("public", "accounts")  # the report DAG's table
ORDERS = TableRef("public", "orders")
POLLS_WHILE_IDLE = 5  # polls of the trigger watched after a run, for a run that must not come


@pytest.fixture
def source_db(publisher: PgCluster) -> str:
    """Two published tables holding rows the snapshot copies; no slot (the DAG creates it)."""
    publisher.create_database(DB)
    for table in ("accounts", "orders"):
        publisher.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, amount int, note text)",
                          dbname=DB)  # fmt: skip
        publisher.execute(f"INSERT INTO {table} SELECT g, g, 'n' || g "
                          "FROM generate_series(1, 200) g", dbname=DB)  # fmt: skip
    publisher.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE accounts, orders", dbname=DB)
    return DB


def dag_settings(publisher: PgCluster, lake: Path) -> dict[str, str]:
    """The connections and the DAG file's settings, as a deployment's environment sets them."""
    source = {"conn_type": "postgres", "host": publisher.host, "port": publisher.port,
              "login": publisher.superuser, "password": publisher.password,
              "schema": DB}  # fmt: skip
    return {
        "AIRFLOW_CONN_DRAIN_ON_CHANGES": json.dumps(source),
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "PGLOGREPL_SPARK_CONN_ID": "spark_local",
        "PGLOGREPL_PUBLISHER_CONN_ID": "drain_on_changes",
        "PGLOGREPL_SLOT": SLOT,
        "PGLOGREPL_PUBLICATIONS": PUBLICATION,
        "PGLOGREPL_LAKE": str(lake),
        "PGLOGREPL_REPORT_TABLE": str(ACCOUNTS),
        "PGLOGREPL_DRAIN_SCHEDULE": "changes",
        "PGLOGREPL_TRIGGER_POLL_SECONDS": "1",
    }


def source_sessions(publisher: PgCluster) -> int:
    """Sessions opened on the source database so far (``pg_stat_database``, read from another
    database). While no run goes, the trigger is the only client there, and each poll opens one
    session (the slot's record) or two (then a peek, when the slot is behind the WAL)."""
    rows = publisher.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (DB,))
    return int(rows[0][0])


def watch_polls(airflow: AirflowServices, publisher: PgCluster, polls: int) -> None:
    """Return once the trigger has polled at least ``polls`` more times: what a run that should
    not come is given to come in (several of the trigger's polls, and of the scheduler's loops
    of a second). Fails if the trigger stops polling."""
    before = source_sessions(publisher)

    def polled() -> bool:
        airflow.alive()
        return source_sessions(publisher) - before >= 2 * polls

    wait_until(polled, timeout=60, what=f"{polls} polls of the trigger (sessions since {before})")


def firings(airflow: AirflowServices) -> int:
    """The trigger's events so far, as the triggerer logged them."""
    return sum(f"slot {SLOT}: " in line and ": firing" in line
               for line in airflow.log("triggerer").splitlines())  # fmt: skip


def new_run(airflow: AirflowServices, dag_id: str, seen: int, run_type: str) -> Run:
    """The DAG's run after the ``seen`` it had, of ``run_type``, once it succeeded."""

    def created() -> Run | None:
        airflow.alive()
        runs = airflow.runs(dag_id)
        return runs[seen] if len(runs) > seen else None

    run = wait_until(created, timeout=90, what=f"run {seen + 1} of {dag_id}")
    assert run.run_type == run_type, (run, airflow.runs(dag_id))
    return airflow.finished(dag_id, run.run_id)


def state_uri(lake: Path, table: TableRef) -> str:
    """The URI of the table's ``state/`` Asset, as the drain and the report DAG name it."""
    from airflow_pglogrepl.operators.assets import lake_table_asset

    return lake_table_asset(str(lake), table, "state").uri


def state_events(airflow: AirflowServices, lake: Path, table: TableRef) -> list[dict[str, Any]]:
    """The extra of each event of the table's ``state/`` Asset, oldest first."""
    rows = airflow.query("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                         "WHERE a.uri = ? ORDER BY e.id", (state_uri(lake, table),))  # fmt: skip
    return [json.loads(extra) for (extra,) in rows]


def fired_by_the_trigger(airflow: AirflowServices, run: Run) -> dict[str, Any]:
    """The trigger's payload behind a drain run: the one event of the watched Asset the run
    was created for."""
    events = airflow.triggering_events(DRAIN, run.run_id)
    assert len(events) == 1, f"one event of the trigger per run, not {events}"
    ((uri, extra),) = events
    assert uri == f"pglogrepl-slot-{SLOT}" and extra["from_trigger"] is True, (uri, extra)
    payload: dict[str, Any] = extra["payload"]
    assert payload["slot"] == SLOT and payload["reason"].startswith("a published change waits")
    return payload


def remembered(airflow: AirflowServices) -> str:
    """Where the WAL was when the trigger last fired, as it keeps it in the watched Asset's
    state store (for a trigger restarted elsewhere)."""
    ((stored,),) = airflow.query("SELECT value FROM asset_state_store WHERE key = ?",
                                 ("pglogrepl.slot_changes.fired",))  # fmt: skip
    return str(json.loads(stored)["wal"])


def assert_lake_equals_source(publisher: PgCluster, lake: Path) -> None:
    for table in (ACCOUNTS, ORDERS):
        assert lake_rows(str(lake), table) == source_rows(publisher, DB, table.name), table


def burst(publisher: PgCluster, *statements: str) -> None:
    """Transactions one after the other, in one session: a burst of changes."""
    with publisher.connect(DB) as conn:
        for statement in statements:
            conn.execute(statement)


def bootstrap(airflow: AirflowServices) -> None:
    """The DAG deployed before its slot exists: the trigger polls and fires nothing; one manual
    run creates the slot and copies the tables, and the report DAG runs on the snapshot's
    event of its table."""

    def polled_twice() -> bool:
        airflow.alive()
        return airflow.log("triggerer").count(f"slot {SLOT} does not exist on the server") >= 2

    wait_until(polled_twice, timeout=120, what="the trigger polling the slot not there yet")
    airflow.cli("dags", "trigger", DRAIN, "--run-id", "bootstrap")
    airflow.finished(DRAIN, "bootstrap")
    assert airflow.xcom(DRAIN, "bootstrap", "initial_snapshot")["committed"] is True
    new_run(airflow, REPORT, 0, "asset_triggered")
    assert firings(airflow) == 0


def report_of(airflow: AirflowServices, lake: Path, run: Run) -> dict[str, Any]:
    """The extra of the one event a report run was created for: of its table's ``state/``."""
    ((uri, extra),) = airflow.triggering_events(REPORT, run.run_id)
    assert uri == state_uri(lake, ACCOUNTS) and extra["table"] == str(ACCOUNTS), (uri, extra)
    return extra


def test_the_drain_runs_once_per_burst_and_the_report_after_its_tables_drains(
    publisher: PgCluster, source_db: str, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    with running_airflow(tmp_path / "airflow", REPO / "dags",
                         dag_settings(publisher, lake)) as airflow:  # fmt: skip
        bootstrap(airflow)
        assert report_of(airflow, lake, airflow.runs(REPORT)[0])["rows"] == 200  # the copy
        # a burst on both tables: one drain run, then the report (its table changed)
        burst(publisher, "UPDATE accounts SET amount = amount + 1 WHERE id % 4 = 0",
              "INSERT INTO accounts SELECT g, g, 'new' FROM generate_series(201, 230) g",
              "DELETE FROM accounts WHERE id % 9 = 0",
              "UPDATE orders SET note = 'burst 1' WHERE id % 5 = 0")  # fmt: skip
        first = new_run(airflow, DRAIN, 1, "asset_triggered")
        fired = fired_by_the_trigger(airflow, first)
        drained = airflow.xcom(DRAIN, first.run_id, "drain")
        assert drained["changes"] == 50 + 30 + 25 + 40, drained
        # the run took the burst: the slot is past where the WAL was when the trigger fired
        assert LSN(drained["confirmed_flush_lsn_after"]) >= LSN(fired["wal_lsn"]), fired
        assert drained["spark_start_s"] is None, drained  # merged in Arrow: no JVM
        assert_lake_equals_source(publisher, lake)
        report = new_run(airflow, REPORT, 1, "asset_triggered")
        assert report_of(airflow, lake, report)["changes"] == 50 + 30 + 25
        # what the report's task read: the one event, once (not again under the alias)
        read = airflow.xcom(REPORT, report.run_id, "changed")
        assert [(e["table"], e["changes"]) for e in read] == [(str(ACCOUNTS), 105)], read
        # idle: the trigger polls on, and nothing runs
        watch_polls(airflow, publisher, POLLS_WHILE_IDLE)
        runs = airflow.runs(DRAIN)
        assert [r.run_type for r in runs] == ["manual", "asset_triggered"], runs  # exactly one
        assert firings(airflow) == 1 and len(airflow.runs(REPORT)) == 2, airflow.runs(REPORT)
        # a burst on the other table only: one more drain run, and no report
        burst(publisher, "INSERT INTO orders SELECT g, g, 'new' FROM generate_series(201, 260) g",
              "DELETE FROM orders WHERE id % 7 = 0")  # fmt: skip
        second = new_run(airflow, DRAIN, 2, "asset_triggered")
        refired = fired_by_the_trigger(airflow, second)
        assert LSN(refired["wal_lsn"]) > LSN(fired["wal_lsn"]), (refired, fired)
        assert airflow.xcom(DRAIN, second.run_id, "drain")["changes"] == 60 + 37
        assert_lake_equals_source(publisher, lake)
        watch_polls(airflow, publisher, POLLS_WHILE_IDLE)
        runs = airflow.runs(DRAIN)
        assert [r.run_type for r in runs] == ["manual", "asset_triggered", "asset_triggered"], runs
        assert all(r.state == "success" for r in runs), runs
        assert firings(airflow) == 2 and len(airflow.runs(REPORT)) == 2, airflow.runs(REPORT)
        assert remembered(airflow) == refired["wal_lsn"]
        # no report due either: the second drain changed the other table's state only
        assert [e.get("changes") for e in state_events(airflow, lake, ACCOUNTS)] == [None, 105]
        assert [e.get("changes") for e in state_events(airflow, lake, ORDERS)] == [None, 40, 97]
        assert not airflow.query("SELECT 1 FROM asset_dag_run_queue WHERE target_dag_id = ?",
                                 (REPORT,))  # fmt: skip
