"""Airflow discovers the provider: ``airflow providers list`` and ``airflow providers hooks``."""

from __future__ import annotations

import json

import pytest

from airflow_pglogrepl import __version__
from tests.support.airflow import airflow_cli

# Runs the Airflow CLI in a process of its own (provider discovery; no metadata database).
pytestmark = pytest.mark.airflow


def test_providers_list_shows_the_package() -> None:
    result = airflow_cli("providers", "list", "--output", "json")
    assert result.returncode == 0, result.stderr
    providers = {p["package_name"]: p for p in json.loads(result.stdout)}
    assert "airflow-pglogrepl" in providers
    assert providers["airflow-pglogrepl"]["version"] == __version__


def test_providers_hooks_shows_the_hook() -> None:
    result = airflow_cli("providers", "hooks", "--output", "json")
    assert result.returncode == 0, result.stderr
    hooks = {h["connection_type"]: h for h in json.loads(result.stdout)}
    assert hooks["pglogrepl"]["class"] == (
        "airflow_pglogrepl.hooks.replication.PgLogicalReplicationHook"
    )
