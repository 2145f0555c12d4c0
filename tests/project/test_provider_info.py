"""Provider metadata is valid for Airflow, and importing the package stays light."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import jsonschema

from airflow_pglogrepl.get_provider_info import get_provider_info
from tests.support.paths import REPO


def test_provider_info_matches_airflows_schema() -> None:
    import airflow

    schema_path = Path(airflow.__file__).parent / "provider_info.schema.json"
    jsonschema.validate(get_provider_info(), json.loads(schema_path.read_text()))


def test_entry_point_is_registered() -> None:
    names = {ep.value for ep in entry_points(group="apache_airflow_provider")}
    assert "airflow_pglogrepl.get_provider_info:get_provider_info" in names


def test_every_listed_module_and_class_imports() -> None:
    info = get_provider_info()
    modules = [m for key in ("hooks", "operators", "sensors", "triggers")
               for entry in info[key] for m in entry["python-modules"]]  # fmt: skip
    assert modules, "the provider lists no modules"
    for module in modules:
        importlib.import_module(module)
    for conn_type in info["connection-types"]:
        module, _, cls = conn_type["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == conn_type["connection-type"]


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
