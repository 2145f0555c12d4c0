"""Importing the package stays light: the provider's modules, as Airflow and the DAG processor
load them, pull no database driver or Spark (the metadata: tests/test_get_provider_info.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_package_import_is_light() -> None:
    loaded = _modules_after("import airflow_pglogrepl, airflow_pglogrepl.lsn")
    assert not {"pyspark", "psycopg", "airflow"} & loaded


def test_hook_import_does_not_pull_pyspark() -> None:
    loaded = _modules_after("import airflow_pglogrepl.hooks.replication")
    assert "pyspark" not in loaded


def test_operator_modules_do_not_pull_pyspark_or_connect() -> None:
    loaded = _modules_after(
        "import airflow_pglogrepl.operators.publication, airflow_pglogrepl.operators.subscription,"
        " airflow_pglogrepl.operators.slots, airflow_pglogrepl.sensors.subscription,"
        " airflow_pglogrepl.sensors.progress, airflow_pglogrepl.operators.upkeep,"
        " airflow_pglogrepl.operators.drain, airflow_pglogrepl.operators.snapshot"
    )
    assert not {"pyspark", "deltalake", "pyarrow"} & loaded
    assert "psycopg" not in loaded, "operator modules should import psycopg only when they run"


def test_parsing_the_shipped_dags_connects_nothing() -> None:
    """The DAG processor builds the operators (their assets and lakes are checked then): that
    must not pull a database driver or Spark into it."""
    for dag in sorted((REPO / "dags").glob("*.py")):
        loaded = _modules_after(f"import runpy; runpy.run_path({str(dag)!r})")
        assert not {"psycopg", "pyspark", "deltalake"} & loaded, dag.name
        assert "airflow.providers.postgres.hooks.postgres" not in loaded, dag.name
