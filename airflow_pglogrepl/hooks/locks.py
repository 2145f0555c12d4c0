"""The lake's writer lock for the Airflow hook (``postgres.locks`` has the statements)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from airflow_pglogrepl.hooks.base import PgSessionHook
from airflow_pglogrepl.postgres import locks


class WriterLockMixin(PgSessionHook):
    """``writer_lock(slot)``: hold the lake's writer lock while the block runs."""

    def writer_lock(
        self, slot: str, *, role: str = "drain"
    ) -> AbstractContextManager[locks.WriterLock]:
        """Hold the writer lock of ``slot``'s lake, or raise ``LakeWriterBusyError`` at once;
        the block gets the ``WriterLock`` whose ``check`` proves it is still held."""
        label = self._source_label()
        return locks.writer_lock(self.connection_params(), slot, role=role, label=label)
