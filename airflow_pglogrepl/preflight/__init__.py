"""Preflight checks for logical replication: pure rules over catalog facts, and their report.

The hook reads the facts (``hooks/catalog.py``); ``checks.evaluate`` judges them; the operator
(``operators/preflight.py``) ties the two together. No SQL and no Airflow in this package.
"""

from __future__ import annotations

from airflow_pglogrepl.exceptions import PreflightFailedError, ReplicaIdentityChangeError
from airflow_pglogrepl.preflight.checks import evaluate
from airflow_pglogrepl.preflight.identity import FixMode, IdentityClass, IdentityFix
from airflow_pglogrepl.preflight.report import Check, Finding, PreflightReport, Severity, Side

__all__ = [
    "Check",
    "Finding",
    "FixMode",
    "IdentityClass",
    "IdentityFix",
    "PreflightFailedError",
    "PreflightReport",
    "ReplicaIdentityChangeError",
    "Severity",
    "Side",
    "evaluate",
]
