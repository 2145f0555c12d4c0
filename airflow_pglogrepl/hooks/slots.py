"""Logical replication slots for the Airflow hook: create, read, list, advance, drop, peek.

The statements are ``postgres.slots``' functions; these methods only supply the session (the
hook's own short one, or ``conn=``) and the hook's logger.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_pglogrepl.hooks.base import Conn, PgSessionHook
from airflow_pglogrepl.identifiers import validate_slot_name
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.failover import FailoverPrimary, FailoverStandby
from airflow_pglogrepl.models.records import SlotCreated, SlotInfo, SlotSpill
from airflow_pglogrepl.postgres import arrow_peek, failover, slots
from airflow_pglogrepl.postgres.slot_stream import SlotStream
from airflow_pglogrepl.postgres.slots import OUTPUT_PLUGINS

__all__ = ["OUTPUT_PLUGINS", "SlotsMixin"]


class SlotsMixin(PgSessionHook):
    """Replication slots on the connected database."""

    def slot_spill(self, name: str) -> SlotSpill | None:
        """The slot's decoding statistics (``postgres.slots.slot_spill``), or None when the
        server keeps none for it."""
        with self.session() as conn:
            return slots.slot_spill(conn, name)

    def create_logical_slot(
        self,
        name: str,
        *,
        plugin: str = "pgoutput",
        temporary: bool = False,
        two_phase: bool = False,
        failover: bool | None = False,
        conn: Conn | None = None,
    ) -> SlotCreated:
        """Create a logical slot (``postgres.slots.create_logical_slot``).

        A temporary slot is dropped when its session ends, so it needs ``conn=`` (a session the
        caller keeps open).
        """
        if temporary and conn is None:
            raise ValueError(
                f"temporary slot {name!r} would be dropped as soon as the hook's own session "
                f"closes; pass conn= (a session you keep open) or create a permanent slot"
            )
        with self._use(conn) as c:
            return slots.create_logical_slot(
                c, name, plugin=plugin, temporary=temporary, two_phase=two_phase,
                failover=failover,
            )  # fmt: skip

    def make_failover_slot(self, name: str) -> None:
        """Synchronize an existing slot to standbys from now on (17+;
        ``postgres.failover.make_failover_slot``)."""
        failover.make_failover_slot(self.connection_params(), name, label=self._source_label())

    def failover_primary(self, name: str) -> FailoverPrimary:
        """This server's side of the slot's failover (``postgres.failover.primary_failover``)."""
        with self.session() as conn:
            return failover.primary_failover(conn, name)

    def failover_standby(self, name: str) -> FailoverStandby:
        """This standby's copy of the slot and its settings
        (``postgres.failover.standby_failover``)."""
        with self.session() as conn:
            return failover.standby_failover(conn, name)

    def drop_slot(self, name: str, *, missing_ok: bool = False, conn: Conn | None = None) -> bool:
        """Drop a slot; False when absent and ``missing_ok`` (``postgres.slots.drop_slot``)."""
        with self._use(conn) as c:
            return slots.drop_slot(c, name, missing_ok=missing_ok)

    def get_slot(
        self, name: str, *, plugin: str | None = None, conn: Conn | None = None
    ) -> SlotInfo:
        """The slot's current record (``postgres.slots.get_slot``)."""
        with self._use(conn) as c:
            return slots.get_slot(c, name, plugin=plugin)

    async def aget_slot(self, name: str) -> SlotInfo | None:
        """The slot's record for triggers (non-blocking); ``None`` when absent."""
        validate_slot_name(name)  # a bad name fails before a connection is tried
        async with self.asession() as conn:
            return await slots.find_slot(conn, name)

    async def ahas_published_change(self, name: str, publications: Sequence[str], *,
                                    upto: LSN) -> bool:  # fmt: skip
        """Whether the slot holds a published change before ``upto``, for triggers
        (``postgres.slots.has_published_change``; the slot does not move)."""
        async with self.asession() as conn:
            return await slots.has_published_change(conn, name, publications, upto)

    def list_slots(self, *, logical_only: bool = True, conn: Conn | None = None) -> list[SlotInfo]:
        """All slots on the server (logical ones only by default), ordered by name."""
        with self._use(conn) as c:
            return slots.list_slots(c, logical_only=logical_only)

    def advance_slot(self, name: str, upto: LSN | str, *, conn: Conn | None = None) -> LSN:
        """Move the slot's confirmed position to ``upto`` (``postgres.slots.advance_slot``)."""
        with self._use(conn) as c:
            return slots.advance_slot(c, name, upto)

    def peek_changes(
        self,
        slot: str,
        *,
        upto_lsn: LSN | str | None,
        options: Mapping[str, str],
        binary: bool = True,
        upto_nchanges: int | None = None,
        batch_rows: int = 5000,
    ) -> Iterator[tuple[LSN, int | None, Any]]:
        """Stream the slot's changes without consuming it (``postgres.slots.peek_changes``)."""
        return slots.peek_changes(
            self.connection_params(), slot, label=self._source_label(),
            upto_lsn=upto_lsn, options=options, binary=binary, upto_nchanges=upto_nchanges,
            batch_rows=batch_rows,
        )  # fmt: skip

    def stream_slot(self, slot: str, **arguments: Any) -> SlotStream:
        """The slot through the replication protocol (``postgres.slot_stream.SlotStream``;
        ``arguments``: its ``start``, ``options`` and ``alive``)."""
        return SlotStream(self.connection_params(), slot, label=self._source_label(), **arguments)

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]:
        """The slot's messages as Arrow batches (``postgres.arrow_peek.peek_arrow``)."""
        return arrow_peek.peek_arrow(
            self.connection_params(), slot, label=self._source_label(),
            upto_lsn=upto_lsn, options=options,
        )  # fmt: skip
