"""README's replication DAG parses and runs as written, preflight first, against real clusters.

The page is where a new user starts: its DAG is written into a DAG folder of its own, loaded by a
``DagBag`` (no import errors), and run with ``dag.test()`` against the session's publisher and
subscriber, each in a fresh database holding the two tables it names. The preflight is checked
to come first, and to stop the run on a publisher that is not set up, before anything is made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import set_airflow_connection
from tests.support.markdown import code_blocks
from tests.support.paths import REPO

pytestmark = [pytest.mark.airflow, pytest.mark.live]

TABLES = (
    "CREATE TABLE public.orders (id bigint PRIMARY KEY, amount numeric);"
    "CREATE TABLE public.customers (id int PRIMARY KEY, name text NOT NULL)"
)


def readme_dag(folder: Path) -> object:
    """The README's DAG block, written to ``folder``, loaded as Airflow loads a DAG file and
    serialized to the metadata database (``dag.test()`` runs the serialized DAG; the session's
    DAG bundle is the suite's own folder, so this one is written to it by hand)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    [block] = [b for b in code_blocks(REPO / "README.md") if "with DAG(" in b.body]
    (folder / "orders_replication.py").write_text(block.body)
    bag = DagBag(dag_folder=str(folder))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag("orders_replication")
    assert dag is not None
    DagBundlesManager().sync_bundles_to_db()  # the bundle row the DAG's row refers to
    sync_bag_to_db(bag, "dags-folder", None)
    return dag


def test_the_readme_dag_starts_with_the_preflight_and_replicates(
    publisher: PgCluster,
    subscriber: PgCluster,
    airflow_home: object,
    tmp_path: Path,
) -> None:
    db = "readme_shop"
    for cluster in (publisher, subscriber):
        cluster.create_database(db)
        cluster.execute(TABLES, dbname=db)
    publisher.execute("INSERT INTO orders SELECT g, g * 1.5 FROM generate_series(1, 500) g",
                      dbname=db)  # fmt: skip
    set_airflow_connection("orders_primary", publisher.airflow_uri(db))
    set_airflow_connection("orders_new", subscriber.airflow_uri(db))
    dag = readme_dag(tmp_path)
    roots = [task.task_id for task in dag.roots]  # type: ignore[attr-defined]
    assert roots == ["preflight"], roots
    try:
        run = dag.test()  # type: ignore[attr-defined]
        assert run.state == "success", run
        assert subscriber.execute("SELECT count(*) FROM orders", dbname=db) == [(500,)]
    finally:
        subscriber.execute("DROP SUBSCRIPTION IF EXISTS orders_sub", dbname=db)
