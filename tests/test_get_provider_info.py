"""The provider metadata Airflow's ProvidersManager reads: valid for Airflow's schema, reached
through pyproject's entry point, naming every task module the package has (an operator or
sensor module left out is missing from Airflow's provider listing), every module it names
importable, and the versions and connection type the package itself declares."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import airflow_pglogrepl
from airflow_pglogrepl.get_provider_info import get_provider_info
from airflow_pglogrepl.versions import SUPPORTED_MAJORS
from tests.support.paths import REPO


def _listed(key: str) -> list[str]:
    return [m for entry in get_provider_info()[key] for m in entry["python-modules"]]


def test_provider_info_matches_airflows_schema() -> None:
    import airflow
    import jsonschema

    schema_path = Path(airflow.__file__).parent / "provider_info.schema.json"
    jsonschema.validate(get_provider_info(), json.loads(schema_path.read_text()))


def test_entry_point_is_registered() -> None:
    names = {ep.value for ep in entry_points(group="apache_airflow_provider")}
    assert "airflow_pglogrepl.get_provider_info:get_provider_info" in names


def test_pyprojects_entry_point_names_this_function() -> None:
    """The installed metadata above may be stale (an editable install made before a change):
    pyproject.toml is what the next wheel carries."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (value,) = project["entry-points"]["apache_airflow_provider"].values()
    module, _, name = value.partition(":")
    assert getattr(importlib.import_module(module), name) is get_provider_info
    assert get_provider_info()["package-name"] == project["name"]


def test_every_listed_module_and_class_imports() -> None:
    info = get_provider_info()
    modules = [m for key in ("hooks", "operators", "sensors", "triggers") for m in _listed(key)]
    assert modules, "the provider lists no modules"
    for module in modules:
        importlib.import_module(module)
    for conn_type in info["connection-types"]:
        module, _, cls = conn_type["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == conn_type["connection-type"]


def _task_modules(package: str) -> set[str]:
    """The public modules of ``package`` that define an operator or sensor class."""
    from airflow.sdk import BaseOperator

    found = set()
    path = importlib.import_module(package).__path__
    for info in pkgutil.iter_modules(path, package + "."):
        if info.name.rpartition(".")[2].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        if any(issubclass(cls, BaseOperator) and cls.__module__ == info.name
               for _, cls in inspect.getmembers(module, inspect.isclass)):  # fmt: skip
            found.add(info.name)
    return found


# Task modules the metadata may leave out (none: CutoverSummaryOperator's module was, until this
# test found it); listing one takes it off here.
LEFT_OUT: set[str] = set()


def test_every_operator_and_sensor_module_of_the_package_is_listed() -> None:
    for key in ("operators", "sensors"):
        modules = _task_modules(f"airflow_pglogrepl.{key}")
        assert modules, key
        missing = sorted(modules - set(_listed(key)) - LEFT_OUT)
        assert not missing, f"get_provider_info()[{key!r}] leaves out {missing}"
        listed_now = sorted(LEFT_OUT & set(_listed(key)))
        assert not listed_now, f"listed now: take {listed_now} off LEFT_OUT"
        assert len(_listed(key)) == len(set(_listed(key))), f"{key}: a module listed twice"


def test_the_versions_said_are_the_packages() -> None:
    info = get_provider_info()
    assert info["versions"] == [airflow_pglogrepl.__version__]
    first, last = SUPPORTED_MAJORS[0], SUPPORTED_MAJORS[-1]
    assert f"Supports PostgreSQL {first} to {last}." in info["description"]
