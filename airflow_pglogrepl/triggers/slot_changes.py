"""An event trigger on a logical slot: a drain DAG scheduled on changes instead of a clock.

Used in an ``AssetWatcher`` (``SlotChangesTrigger``): the triggerer polls the slot every
``poll_interval`` seconds and fires an event of the watched Asset, which runs the DAGs scheduled
on it, once per burst of changes:

* a burst begins when the slot is ``min_lag_bytes`` or more behind the server's WAL and (with
  ``check_changes``, the default) holds a published change: a peek for one change, which never
  consumes the slot (WAL always moves: other databases, tables outside the publications,
  checkpoints; only a change the drain would store is one). A slot a drain is reading
  (``active``) is left alone, and so is one whose lake's writer lock is held (a drain or
  snapshot has started): the run takes what arrives, and a peek would hold the slot it is
  about to read (PostgreSQL lets one session at a time use a slot).
* after an event, it waits until the slot has been drained up to where the WAL was when it fired
  before it fires again: the drain that event started takes the burst, and an idle database
  starts nothing. If no drain gets there within ``refire_after_s`` (the run failed, or nothing
  consumed the event), it fires again.
* ``max_retained_bytes``: fire whatever the changes when the slot holds that much WAL from its
  ``restart_lsn`` (the disk it pins), so a slot that keeps WAL for another reason is drained
  before the disk fills.

Where it fired is kept in the asset state store of the watched Asset (a trigger may be restarted
on another triggerer), else in the trigger itself. Each event's payload says why it fired, the
slot's position and the WAL's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import SlotInfo

FIRED_KEY = "pglogrepl.slot_changes.fired"  # in the asset state store: {"wal": ..., "at": ...}


@dataclass(frozen=True)
class Fired:
    """Where the WAL was when the trigger last fired, and when (epoch seconds)."""

    wal: LSN
    at: float


def burst(slot: SlotInfo, fired: Fired | None, *, now: float, min_lag_bytes: int,
          max_retained_bytes: int | None, refire_after_s: float) -> str | None:  # fmt: skip
    """Why the slot's state may start a burst (then a peek confirms a change, unless the reason
    is retained WAL), or None: not behind enough, a drain reads it, or the last event's burst is
    not drained yet."""
    confirmed = slot.confirmed_flush_lsn
    if confirmed is None:
        return None
    retained = slot.retained_bytes or 0
    if max_retained_bytes is not None and retained >= max_retained_bytes:
        pinned = f"retained WAL {retained} bytes >= {max_retained_bytes}"
    else:
        pinned = None
    if fired is not None and confirmed < fired.wal and now - fired.at < refire_after_s:
        return None  # the burst last fired for is not drained yet
    if slot.active and pinned is None:
        return None  # a drain is reading it: it takes what arrives
    if pinned is not None:
        return pinned
    lag = slot.current_lsn - confirmed
    if lag >= min_lag_bytes:
        return f"lag {lag} bytes >= {min_lag_bytes}"
    return None


class SlotChangesTrigger(BaseEventTrigger):
    """Fires once per burst of changes in ``slot_name`` (see the module): for an
    ``AssetWatcher`` of the Asset a drain DAG is scheduled on."""

    def __init__(self, *, postgres_conn_id: str, slot_name: str, publications: Sequence[str],
                 database: str | None = None, poll_interval: float = 30.0,
                 min_lag_bytes: int = 1, max_retained_bytes: int | None = None,
                 check_changes: bool = True, refire_after_s: float = 3600.0) -> None:  # fmt: skip
        super().__init__()
        if poll_interval <= 0 or refire_after_s <= 0 or min_lag_bytes < 1:
            raise ValueError("poll_interval and refire_after_s must be positive, min_lag_bytes "
                             "at least 1")  # fmt: skip
        self.postgres_conn_id = postgres_conn_id
        self.slot_name = slot_name
        self.publications = list(publications)
        self.database = database
        self.poll_interval = poll_interval
        self.min_lag_bytes = min_lag_bytes
        self.max_retained_bytes = max_retained_bytes
        self.check_changes = check_changes
        self.refire_after_s = refire_after_s
        self._fired: Fired | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "postgres_conn_id": self.postgres_conn_id,
                "slot_name": self.slot_name,
                "publications": self.publications,
                "database": self.database,
                "poll_interval": self.poll_interval,
                "min_lag_bytes": self.min_lag_bytes,
                "max_retained_bytes": self.max_retained_bytes,
                "check_changes": self.check_changes,
                "refire_after_s": self.refire_after_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        fired = await self._recall()
        while True:
            payload = None
            try:
                payload = await self.check(fired)
            except Exception as exc:  # the watcher goes on: a restart or a network fault passes
                self.log.warning("slot %s: could not check for changes (%s: %s); trying again "
                                 "in %.0f s", self.slot_name, type(exc).__name__, exc,
                                 self.poll_interval)  # fmt: skip
            if payload is not None:
                fired = Fired(LSN(payload["wal_lsn"]), time.time())
                await self._remember(fired)
                self.log.info("slot %s: %s: firing", self.slot_name, payload["reason"])
                yield TriggerEvent(payload)
            await asyncio.sleep(self.poll_interval)

    async def check(self, fired: Fired | None) -> dict[str, Any] | None:
        """One poll: the event's payload when it fires now, else None."""
        from airflow_pglogrepl.hooks.for_connection import replication_hook

        hook = replication_hook(self.postgres_conn_id, self.database)
        slot = await hook.aget_slot(self.slot_name)
        if slot is None:
            self.log.warning("slot %s does not exist on the server: nothing to watch until it "
                             "does (check the slot name)", self.slot_name)  # fmt: skip
            return None
        reason = burst(slot, fired, now=time.time(), min_lag_bytes=self.min_lag_bytes,
                       max_retained_bytes=self.max_retained_bytes,
                       refire_after_s=self.refire_after_s)  # fmt: skip
        if reason is None:
            return None
        pinned = reason.startswith("retained")
        if self.check_changes and not pinned:
            if await hook.awriter_lock_holder(self.slot_name) is not None:
                return None  # a run is on the slot: its peek would hold the slot the run reads
            if not await hook.ahas_published_change(self.slot_name, self.publications,
                                                    upto=slot.current_lsn):  # fmt: skip
                return None
            reason = f"a published change waits ({reason})"
        return {
            "slot": self.slot_name,
            "reason": reason,
            "confirmed_flush_lsn": str(slot.confirmed_flush_lsn),
            "wal_lsn": str(slot.current_lsn),
            "lag_bytes": slot.current_lsn - (slot.confirmed_flush_lsn or slot.current_lsn),
            "retained_bytes": slot.retained_bytes,
        }

    async def _recall(self) -> Fired | None:
        """Where it last fired: the asset state store's record, else this trigger's own."""
        store = self.asset_state_store
        if store is None:
            return self._fired
        try:
            found = await store.aget(FIRED_KEY)
        except Exception as exc:  # (several watched assets, or the store away: in memory)
            self.log.info("asset state store not used (%s): where it fired is kept in memory",
                          exc)  # fmt: skip
            return self._fired
        if isinstance(found, dict) and "wal" in found and "at" in found:
            return Fired(LSN(str(found["wal"])), float(str(found["at"])))
        return self._fired

    async def _remember(self, fired: Fired) -> None:
        self._fired = fired
        store = self.asset_state_store
        if store is None:
            return
        try:
            await store.aset(FIRED_KEY, {"wal": str(fired.wal), "at": fired.at})
        except Exception as exc:
            self.log.info("asset state store not written (%s): kept in memory", exc)
