"""Table checksums for the cutover's parity check, read the same way on both servers (the
statements: ``postgres/parity.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_pglogrepl.hooks.base import PgSessionHook
from airflow_pglogrepl.models.records import TableChecksum
from airflow_pglogrepl.postgres import parity
from airflow_pglogrepl.tables import TableRef

__all__ = ["ParityMixin", "TableChecksum"]


class ParityMixin(PgSessionHook):
    """Columns and checksums of tables, for comparing two servers."""

    def table_columns(self, tables: Sequence[TableRef]) -> dict[TableRef, tuple[str, ...]]:
        """Replicated columns of each table that exists, in column order (no dropped or
        generated columns: ``postgres.parity.table_columns``)."""
        if not tables:
            return {}
        with self.session() as conn:
            return parity.table_columns(conn, tables)

    def table_checksum(self, table: TableRef, columns: Sequence[str]) -> TableChecksum:
        """Row count and order-independent checksum of ``columns`` of ``table``
        (``postgres.parity.table_checksum``)."""
        with self.session() as conn:
            return parity.table_checksum(conn, table, columns)
