"""``PgSource``: the source database of a drain or snapshot, from a libpq DSN, without Airflow.

The Spark applications run under spark-submit with the source in ``PGLOGREPL_SOURCE_DSN``; this
is what they talk to. Each call opens a short session (the writer lock and an exported snapshot
hold theirs for as long as the caller keeps them), exactly as the Airflow hook's methods do with
the same functions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import ColumnOrigins, SlotInfo
from airflow_pglogrepl.postgres import (
    arrow_peek,
    columns,
    failover,
    locks,
    server,
    slots,
    timelines,
)
from airflow_pglogrepl.postgres.connect import Conn, connect, dsn_params
from airflow_pglogrepl.postgres.coverage import SourceCoverage, publication_coverage
from airflow_pglogrepl.postgres.slot_stream import SlotStream
from airflow_pglogrepl.postgres.snapshot import ExportedSnapshot, create_slot_with_snapshot
from airflow_pglogrepl.tables import TableRef

DSN_ENV = SOURCE_DSN_ENV


class PgSource:
    """One PostgreSQL database reached by a DSN (``label`` names it in errors, never the DSN)."""

    def __init__(self, dsn: str, *, label: str = DSN_ENV) -> None:
        self._params = dsn_params(dsn)
        self.label = label

    def connection_params(self) -> dict[str, str]:
        """libpq keyword parameters (they contain the password)."""
        return dict(self._params)

    def session(self) -> Conn:
        return connect(self._params, label=self.label)

    def get_slot(self, name: str, *, plugin: str | None = None) -> SlotInfo:
        with self.session() as conn:
            return slots.get_slot(conn, name, plugin=plugin)

    def advance_slot(self, name: str, upto: LSN | str) -> LSN:
        with self.session() as conn:
            return slots.advance_slot(conn, name, upto)

    def drop_slot(self, name: str, *, missing_ok: bool = False) -> bool:
        with self.session() as conn:
            return slots.drop_slot(conn, name, missing_ok=missing_ok)

    def source_identity(self) -> dict[str, object]:
        with self.session() as conn:
            return server.source_identity(conn)

    def switch_points(self, timeline: int) -> dict[int, LSN]:
        """The ancestors of ``timeline`` on this server, each with the LSN where its history
        left it (``postgres.timelines``)."""
        with connect(self._params, label=self.label, replication=True) as conn:
            return timelines.switch_points(conn, timeline)

    def absent_standby_slots(self) -> list[str]:
        with self.session() as conn:  # (what a failover slot's reads would wait for)
            return failover.absent_standby_slots(conn)

    def missing_publications(self, names: Sequence[str]) -> list[str]:
        with self.session() as conn:
            return server.missing_publications(conn, names)

    def publication_coverage(self, names: Sequence[str], *,
                             known: Collection[int] | None = None) -> SourceCoverage:  # fmt: skip
        with self.session() as conn:
            return publication_coverage(conn, names, known=known)

    def flush_lsn(self) -> LSN:
        with self.session() as conn:
            return server.flush_lsn(conn)

    def peek_changes(
        self,
        slot: str,
        *,
        upto_lsn: LSN | str | None,
        options: Mapping[str, str],
        batch_rows: int = 5000,
        upto_nchanges: int | None = None,
    ) -> Iterator[tuple[LSN, int | None, Any]]:
        return slots.peek_changes(
            self._params, slot, label=self.label, upto_lsn=upto_lsn, options=options,
            batch_rows=batch_rows, upto_nchanges=upto_nchanges,
        )  # fmt: skip

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]:
        return arrow_peek.peek_arrow(
            self._params, slot, label=self.label, upto_lsn=upto_lsn, options=options
        )

    def stream_slot(self, slot: str, **arguments: Any) -> SlotStream:
        """``SlotStream`` of ``slot``; ``arguments``: its ``start``, ``options``, ``alive``."""
        return SlotStream(self._params, slot, label=self.label, **arguments)

    def column_origins(self, table: TableRef, names: Sequence[str]) -> ColumnOrigins:
        with self.session() as conn:
            return columns.column_origins(conn, table, names)

    def writer_lock(
        self, slot: str, *, role: str = "drain"
    ) -> AbstractContextManager[locks.WriterLock]:
        return locks.writer_lock(self._params, slot, role=role, label=self.label)

    def create_slot_with_snapshot(
        self, name: str, *, plugin: str = "pgoutput", temporary: bool = False,
        wait_s: float | None = None, failover: bool | None = False,
    ) -> ExportedSnapshot:  # fmt: skip
        return create_slot_with_snapshot(
            self._params, name, plugin=plugin, temporary=temporary, label=self.label,
            wait_s=wait_s, failover=failover,
        )  # fmt: skip
