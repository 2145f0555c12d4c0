"""The lake's writer lock for the Airflow hook (``postgres.locks`` has the statements)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from airflow_pglogrepl.hooks.base import PgSessionHook
from airflow_pglogrepl.postgres import locks


class WriterLockMixin(PgSessionHook):
    """``writer_lock(slot)``: hold the lake's writer lock while the block runs;
    ``awriter_lock_holder(slot)``: who holds it, for triggers."""

    async def awriter_lock_holder(self, slot: str) -> dict[str, Any] | None:
        """The session holding ``slot``'s writer lock (a drain or snapshot running), or None."""
        async with self.asession() as conn:
            return await locks.awriter_lock_holder(conn, slot)

    def writer_lock(
        self, slot: str, *, role: str = "drain"
    ) -> AbstractContextManager[locks.WriterLock]:
        """Hold the writer lock of ``slot``'s lake, or raise ``LakeWriterBusyError`` at once;
        the block gets the ``WriterLock`` whose ``check`` proves it is still held."""
        label = self._source_label()
        return locks.writer_lock(self.connection_params(), slot, role=role, label=label)
