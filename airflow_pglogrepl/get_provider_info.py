"""Provider metadata for Airflow's ProvidersManager (the ``apache_airflow_provider`` entry point).

Airflow reads this without importing the modules it names, so it must stay a plain literal.
"""

from __future__ import annotations

from typing import Any

from airflow_pglogrepl import __version__
from airflow_pglogrepl.versions import SUPPORTED_MAJORS

INTEGRATION = "PostgreSQL logical replication"


def get_provider_info() -> dict[str, Any]:
    """The provider's hooks, operators, sensors, triggers and connection type."""
    return {
        "package-name": "airflow-pglogrepl",
        "name": "PostgreSQL logical replication",
        "description": (
            "Publications, subscriptions, preflight checks, readiness and lag sensors, "
            "sensor-gated cutovers (major-version upgrades among them), and exactly-once slot "
            "drains into a Delta Lake lake on Spark. Supports PostgreSQL "
            f"{SUPPORTED_MAJORS[0]} to {SUPPORTED_MAJORS[-1]}."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://www.postgresql.org/docs/current/logical-replication.html",
                "tags": ["software"],
            }
        ],
        **_modules(),
        "asset-uris": _asset_uris(),
        "connection-types": [
            {
                "hook-class-name": "airflow_pglogrepl.hooks.replication.PgLogicalReplicationHook",
                "hook-name": "PostgreSQL logical replication",
                "connection-type": "pglogrepl",
                "ui-field-behaviour": {"relabeling": {"schema": "Database"}},
            }
        ],
    }


def _modules() -> dict[str, Any]:
    """The hooks, operators, sensors and triggers, by module."""
    return {
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_pglogrepl.hooks.replication"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_pglogrepl.operators.publication",
                    "airflow_pglogrepl.operators.subscription",
                    "airflow_pglogrepl.operators.slots",
                    "airflow_pglogrepl.operators.preflight",
                    "airflow_pglogrepl.operators.fence",
                    "airflow_pglogrepl.operators.sequences",
                    "airflow_pglogrepl.operators.parity",
                    "airflow_pglogrepl.operators.conflicts",
                    "airflow_pglogrepl.operators.finalize",
                    "airflow_pglogrepl.operators.summary",
                    "airflow_pglogrepl.operators.spark_submit",
                    "airflow_pglogrepl.operators.drain",
                    "airflow_pglogrepl.operators.snapshot",
                    "airflow_pglogrepl.operators.upkeep",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_pglogrepl.sensors.subscription",
                    "airflow_pglogrepl.sensors.progress",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_pglogrepl.triggers.replication",
                    "airflow_pglogrepl.triggers.slot_changes",
                ],
            }
        ],
    }


def _asset_uris() -> list[dict[str, Any]]:
    """The lake tables' Asset URI schemes (``operators.assets``)."""
    return [
        {
            "schemes": ["pglogrepl+file", "pglogrepl+s3"],
            "handler": "airflow_pglogrepl.operators.assets.sanitize_uri",
            "factory": "airflow_pglogrepl.operators.assets.create_asset",
            "to_openlineage_converter": (
                "airflow_pglogrepl.operators.assets.convert_asset_to_openlineage"
            ),
        }
    ]
