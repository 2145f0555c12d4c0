"""Catalog inspection for preflight checks: roles, tables, columns, replica identity, privileges."""

from __future__ import annotations

from airflow_pglogrepl.hooks.base import PgSessionHook


class CatalogMixin(PgSessionHook):
    """Reads what preflight checks need from the system catalogs."""
