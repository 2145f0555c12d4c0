"""Typed records the hook returns: a replication slot, a created slot, the server's settings.

Each has ``to_dict()`` giving plain JSON types (LSNs as PostgreSQL text), which is what operators
push to XCom, so the XCom value reads the same as ``psql`` output.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.lsn import LSN


def _jsonable(value: Any) -> Any:
    if isinstance(value, LSN):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


class _Record:
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable form (LSNs as text, timestamps ISO 8601)."""
        return {
            f.name: _jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }


@dataclass(frozen=True)
class SlotInfo(_Record):
    """One row of ``pg_replication_slots``, plus how much WAL the slot holds back.

    ``restart_lsn`` is the oldest WAL the slot still needs (decoding restarts there);
    ``confirmed_flush_lsn`` is what the consumer has confirmed (changes come from there on).
    ``retained_bytes`` is the distance from ``restart_lsn`` to the server's current WAL position:
    the disk this slot keeps from being recycled.
    See https://www.postgresql.org/docs/15/view-pg-replication-slots.html
    """

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: LSN | None
    confirmed_flush_lsn: LSN | None
    wal_status: str | None
    safe_wal_size: int | None
    two_phase: bool | None
    retained_bytes: int | None
    current_lsn: LSN
    inactive_since: dt.datetime | None = None  # PostgreSQL 17+

    @property
    def is_logical(self) -> bool:
        """True for a logical (decoding) slot, False for a physical one."""
        return self.slot_type == "logical"


@dataclass(frozen=True)
class SlotCreated(_Record):
    """What creating a logical slot returned: its name and its consistent point.

    Changes committed after ``lsn`` are decoded from this slot; nothing before it is.
    ``snapshot_name`` is set only when the slot was created with an exported snapshot.
    """

    name: str
    lsn: LSN
    plugin: str
    snapshot_name: str | None = None


@dataclass(frozen=True)
class ServerFacts(_Record):
    """Version and the settings logical replication depends on, sizes in bytes.

    ``max_slot_wal_keep_size`` is ``None`` when unlimited (``-1``): slots may then retain WAL
    until the disk is full.
    """

    version_num: int
    version: str
    in_recovery: bool
    wal_level: str
    max_replication_slots: int
    max_wal_senders: int
    max_logical_replication_workers: int
    max_worker_processes: int
    max_sync_workers_per_subscription: int
    logical_decoding_work_mem: int
    max_slot_wal_keep_size: int | None

    @property
    def major_version(self) -> int:
        """15 for 15.x, and so on."""
        return self.version_num // 10000
