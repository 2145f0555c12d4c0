"""Initial snapshots for the Airflow hook: a slot created with an exported snapshot.

The statement and the readers are in ``postgres.snapshot`` (no Airflow: Spark executors use
them); this mixin only supplies the hook's connection.
"""

from __future__ import annotations

from airflow_pglogrepl.hooks.base import PgSessionHook
from airflow_pglogrepl.postgres.snapshot import ExportedSnapshot, create_slot_with_snapshot


class SnapshotMixin(PgSessionHook):
    """Slot creation with an exported snapshot (replication protocol), for the hook family."""

    def create_slot_with_snapshot(self, name: str, *, plugin: str = "pgoutput",
                                  temporary: bool = False, wait_s: float | None = None,
                                  failover: bool | None = False) -> ExportedSnapshot:  # fmt: skip
        """``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')`` (see
        ``postgres.snapshot.create_slot_with_snapshot``); the result holds the session."""
        return create_slot_with_snapshot(
            self.connection_params(), name, plugin=plugin, temporary=temporary,
            label=self._source_label(), wait_s=wait_s, failover=failover,
        )  # fmt: skip
