"""``replication_hook``: the hook of an Airflow connection id, built lazily (a DAG file that
imports it loads neither psycopg nor the hook), and pointed at another database when asked."""

from __future__ import annotations

import subprocess
import sys

from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from tests.support.databases import Database


def test_importing_it_loads_neither_psycopg_nor_the_hook() -> None:
    code = (
        "import sys\n"
        "import airflow_pglogrepl.hooks.for_connection\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('psycopg', 'airflow')\n"
        "         or m == 'airflow_pglogrepl.hooks.replication']\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_connection_and_database_it_is_built_for() -> None:
    plain = replication_hook("some_conn")
    assert isinstance(plain, PgLogicalReplicationHook)
    assert (plain.get_conn_id(), plain.database) == ("some_conn", None)
    other = replication_hook("some_conn", "other db")
    assert (other.get_conn_id(), other.database) == ("some_conn", "other db")
    assert replication_hook("some_conn", "").database is None  # empty: the connection's own


def test_the_database_given_is_the_one_connected_to(database: Database) -> None:
    assert database.hook.database_name() == database.name
