"""The provider's metrics, sent through Airflow's own ``Stats``.

Why Airflow's: it sends them where the deployment already sends its own (StatsD, OpenTelemetry
or Datadog, by the ``[metrics]`` settings), so nothing is configured twice. With metrics off
(the default), every call here does nothing.

Names are ``pglogrepl.<slot>.<what>`` (docs/reference/metrics.md): the slot names the drain
and its lake, and is a valid metric name as PostgreSQL allows slot names (lower-case letters,
digits and underscores). StatsD has no tags, so what a metric is of is in its name; other
characters a name would hold are replaced with ``_``.

A metric never fails a task: a backend that refuses one is logged at DEBUG and the task goes on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_pglogrepl.models.records import SlotInfo

log = logging.getLogger("airflow_pglogrepl.metrics")

PREFIX = "pglogrepl"
# pg_replication_slots.wal_status as a number a gauge can hold (and an alert compare):
# 0 reserved, 1 extended, 2 unreserved (WAL past max_slot_wal_keep_size: about to be lost),
# 3 lost
WAL_STATUS = {"reserved": 0, "extended": 1, "unreserved": 2, "lost": 3}


def metric_name(*parts: object) -> str:
    """``pglogrepl.<part>.<part>...``, each part with what a metric name cannot hold as ``_``."""
    return ".".join([PREFIX, *(re.sub(r"[^A-Za-z0-9_-]", "_", str(p)) for p in parts)])


def slot(info: SlotInfo) -> None:
    """A slot as the server sees it now: how far behind its consumer is (``lag_bytes``, from
    its confirmed position to the server's), how much WAL it holds (``retained_bytes``, from
    its restart position), ``wal_status`` (``WAL_STATUS``) and whether a consumer is
    connected."""
    confirmed = info.confirmed_flush_lsn
    lag = None if confirmed is None else max(0, int(info.current_lsn) - int(confirmed))
    _gauge(metric_name(info.name, "lag_bytes"), lag)
    _gauge(metric_name(info.name, "retained_bytes"), info.retained_bytes)
    _gauge(metric_name(info.name, "wal_status"), WAL_STATUS.get(info.wal_status or ""))
    _gauge(metric_name(info.name, "active"), int(info.active))


def failover(slot_name: str, *, ready: bool, standby_lag_bytes: int | None) -> None:
    """Whether a promotion of a standby keeps the slot (``failover.ready``, 1 or 0), and how
    far the nearest ready standby's copy is behind the primary's slot
    (``failover.standby_lag_bytes``; -1 when no copy is ready, so a gauge never keeps a lag
    from when one was)."""
    _gauge(metric_name(slot_name, "failover", "ready"), int(ready))
    lag = -1 if standby_lag_bytes is None else standby_lag_bytes
    _gauge(metric_name(slot_name, "failover", "standby_lag_bytes"), lag)


def drain(slot_name: str, result: Mapping[str, Any]) -> None:
    """A drain run's summary (``SlotDrainOperator``'s return value)."""
    name = str(slot_name)
    _count(metric_name(name, "drain", "runs"), 1)
    _count(metric_name(name, "drain", "windows"), result.get("windows"))
    _count(metric_name(name, "drain", "transactions"), result.get("transactions"))
    _count(metric_name(name, "drain", "changes"), result.get("changes"))
    _gauge(metric_name(name, "drain", "changes_per_s"), result.get("changes_per_s"))
    _gauge(metric_name(name, "drain", "lag_bytes_left"), result.get("lag_bytes_left"))
    _gauge(metric_name(name, "drain", "idle"), int(bool(result.get("idle"))))
    _gauge(metric_name(name, "drain", "quarantined_tables"), len(result.get("quarantined") or {}))
    _seconds(metric_name(name, "drain", "materialize"), result.get("materialize_s"))
    _count(metric_name(name, "drain", "tables_merged"), len(result.get("materialized") or {}))
    checked = result.get("parity") or {}
    if checked:
        differing = [f for f in checked.values() if not f.get("equal")]
        _gauge(metric_name(name, "parity", "tables_differing"), len(differing))
        _gauge(metric_name(name, "parity", "rows_differing"), sum(
            int(f.get(f"{kind}_rows", 0)) for f in differing
            for kind in ("missing", "extra", "different", "duplicate")
        ))  # fmt: skip


def snapshot(slot_name: str, result: Mapping[str, Any]) -> None:
    """A snapshot's summary (``InitialSnapshotOperator``'s return value)."""
    name = str(slot_name)
    _count(metric_name(name, "snapshot", "rows"), result.get("rows"))
    _count(metric_name(name, "snapshot", "tables"), len(result.get("tables") or {}))
    _seconds(metric_name(name, "snapshot", "copy"), result.get("copy_s"))


def upkeep(slot_name: str, result: Mapping[str, Any], seconds: float) -> None:
    """A lake upkeep's report (``LakeUpkeepOperator``'s return value) and how long it took."""
    name = str(slot_name)
    _seconds(metric_name(name, "upkeep"), seconds)
    _count(metric_name(name, "upkeep", "compacted_tables"), result.get("compacted"))
    _count(metric_name(name, "upkeep", "files_removed"), result.get("files_removed"))
    _count(metric_name(name, "upkeep", "bytes_removed"), result.get("bytes_removed"))


def subscription(name: str, *, tables_not_ready: int | None, apply_errors: int | None) -> None:
    """A subscription on the subscriber: its tables not yet in state ``r``, and its apply
    errors (``pg_stat_subscription_stats.apply_error_count``, PostgreSQL 15+)."""
    _gauge(metric_name("subscription", name, "tables_not_ready"), tables_not_ready)
    _gauge(metric_name("subscription", name, "apply_errors"), apply_errors)


# -- sending ------------------------------------------------------------------------------------


def _stats() -> Any:
    from airflow.providers.common.compat.sdk import Stats

    return Stats


def _gauge(name: str, value: object) -> None:
    if value is None:
        return
    _send("gauge", name, float(str(value)))


def _count(name: str, value: object) -> None:
    if not value:
        return
    _send("incr", name, int(str(value)))


def _seconds(name: str, value: object) -> None:
    if value is None:
        return
    _send("timing", name, float(str(value)) * 1000.0)  # StatsD timers are in milliseconds


def _send(kind: str, name: str, value: float) -> None:
    try:
        getattr(_stats(), kind)(name, value)
    except Exception as exc:  # a metric never fails a task
        log.debug("metric %s %s not sent: %s", kind, name, exc)
