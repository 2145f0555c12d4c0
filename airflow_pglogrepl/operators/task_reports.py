"""The paragraph a drain or snapshot task ends its log with: what the run did, in one place.

An on-call engineer opening a task log reads its end first. The applications log their progress
(a line per window, per merged table) and return a JSON summary that goes to XCom; these
functions turn that summary into a few lines a person reads at a glance: how much was drained,
between which LSNs, where it went, what it cost and what is left. Pure functions of the summary,
so they are tested without a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def drain_paragraph(result: Mapping[str, Any], *, lake_root: str) -> str:
    """The closing paragraph of a ``SlotDrainOperator`` run from its return value."""
    slot = result.get("slot")
    before = result.get("confirmed_flush_lsn_before")
    after = result.get("confirmed_flush_lsn_after")
    if result.get("idle"):
        return (
            f"Drain of slot {slot} into {lake_root}: nothing to do, no Spark started. The slot and "
            f"the lake stay at {after}; "
            f"{_bytes(result.get('lag_bytes_left'))} of WAL without a published change lie "
            f"past it."
        )
    tables: Mapping[str, int] = result.get("tables") or {}
    lines = [
        f"Drain of slot {slot} into {lake_root}: {_count(result.get('changes'))} changes in "
        f"{_count(result.get('transactions'))} transactions, {result.get('windows', 0)} "
        f"windows; confirmed_flush_lsn {before} -> {after} "
        f"({_bytes(result.get('wal_bytes'))} of WAL).",
    ]
    if tables:
        busiest = sorted(tables.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{name} {_count(n)}" for name, n in busiest[:5])
        more = f" and {len(busiest) - 5} more" if len(busiest) > 5 else ""
        lines.append(f"Changes by table: {shown}{more}.")
    merged = result.get("materialized")
    if merged is not None:
        spark = result.get("spark_start_s")
        how = "no Spark started" if spark is None else f"Spark started in {spark:.1f} s"
        lines.append(
            f"Merged {len(merged)} tables into state/ in "
            f"{float(result.get('materialize_s') or 0):.1f} s ({how})."
        )
    quarantined: Mapping[str, Mapping[str, Any]] = result.get("quarantined") or {}
    if quarantined:
        shown = "; ".join(f"{name} ({held.get('error')}: {held.get('what')}; "
                          f"{_count(held.get('changes'))} changes this run)"
                          for name, held in sorted(quarantined.items()))  # fmt: skip
        lines.append(
            f"In quarantine, their changes kept in {lake_root}/_pglogrepl/quarantine: {shown}. "
            f"Correct the cause, then re-snapshot them (InitialSnapshotOperator(tables=...))."
        )
    left = result.get("lag_bytes_left")
    if left:
        lines.append(f"{_bytes(left)} of WAL were past this run's end: the next run drains them.")
    return " ".join(lines)


def snapshot_paragraph(result: Mapping[str, Any], *, lake_root: str) -> str:
    """The closing paragraph of an ``InitialSnapshotOperator`` run from its return value."""
    slot = result.get("slot")
    status = result.get("status")
    point = result.get("consistent_point")
    if status == "exists":
        return f"Snapshot of slot {slot}: {lake_root} already holds it (at {point}); nothing done."
    if status == "drained":
        return f"Snapshot of slot {slot}: {lake_root} is drained without one; nothing done."
    tables: Mapping[str, Any] = result.get("tables") or {}
    recovered = " (committed before the job failed; finished by this task)"
    return (
        f"Snapshot of slot {slot} into {lake_root}: {_count(result.get('rows'))} rows of "
        f"{len(tables)} tables, committed at {point}"
        f"{recovered if result.get('recovered') else ''}."
    )


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _bytes(value: object) -> str:
    if not isinstance(value, int):
        return "? bytes"
    size = float(value)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} bytes"  # pragma: no cover
