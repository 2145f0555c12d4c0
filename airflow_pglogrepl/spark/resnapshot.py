"""A drain run's repair of what the WAL does not carry: the tables its coverage check names
(``pipeline.coverage``: added to the publication holding rows, a partition attached holding
rows, one detached or dropped) re-snapshotted by the run itself, before it reads the slot.

Each table is copied in a temporary slot's exported snapshot and replaces its state whole at
that snapshot's consistent point, exactly as ``snapshot_app --table`` does
(``spark.snapshot``): a reader sees the table before or after, never half of it, its changelog
goes on, and the merge applies only the changes at or after that point. The run holds the
lake's writer lock, so no merge can write over the copy. A table the copy cannot reach (no
REPLICATION privilege for the exported snapshot, a lock not granted in time, a transaction open
for longer than ``WAIT_S``, Spark failing) stays named, with the reason, and the run drains on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_pglogrepl.lake.coverage import Gap
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.pipeline.repair import Repair

__all__ = ["REPAIRED", "Resnapshot"]

log = logging.getLogger("airflow_pglogrepl.drain")

# The gaps a copy of the table repairs: its rows are all in its source now.
REPAIRED = frozenset({"added", "attached", "detached"})

# How long the copy's exported snapshot may wait for transactions open when it is asked for
# (one idle in transaction would hold the whole drain): then the run drains on without it.
WAIT_S = 120.0


class Resnapshot(Repair):
    """The repair a drain run is given (``Drain(repair=...)``): called with the gaps its check
    found, it re-snapshots their tables and says which it repaired."""

    def __init__(self, *, spark: Callable[[], Any], source: Any, lake: Lake, slot: str,
                 publications: Sequence[str], wait_s: float = WAIT_S) -> None:  # fmt: skip
        self.spark = spark
        self.source = source
        self.lake = lake
        self.slot = slot
        self.publications = list(publications)
        self.wait_s = wait_s

    def __call__(self, gaps: Mapping[str, Gap]) -> dict[str, str | None]:
        """Each table it tried: None when it is whole again, else why not."""
        from airflow_pglogrepl.lake import coverage
        from airflow_pglogrepl.lake.snapshots import temporary_slot_name
        from airflow_pglogrepl.spark.snapshot import SnapshotCopy, SnapshotPoint
        from airflow_pglogrepl.tables import parse_tables

        tables = sorted(table for table, gap in gaps.items() if gap.reason in REPAIRED)
        if not tables:
            return {}
        log.warning("re-snapshotting %s, which the WAL could not keep equal to the source, "
                    "before draining", ", ".join(tables))  # fmt: skip
        try:
            self.spark()  # started before the slot: the exporting session waits for no JVM
            name = temporary_slot_name(self.slot)
            with self.source.create_slot_with_snapshot(name, temporary=True,
                                                       wait_s=self.wait_s) as held:  # fmt: skip
                SnapshotCopy(
                    spark=self.spark, lake=self.lake, reader_params=self.source.connection_params(),
                    publications=self.publications, tables=parse_tables(tables),
                    point=SnapshotPoint(self.slot, held.consistent_point, held.snapshot_name),
                ).run()  # fmt: skip
        except Exception as exc:  # the drain goes on: a failed copy must not stop the slot
            reason = f"the run's re-snapshot failed: {type(exc).__name__}: {exc}"
            log.warning("could not re-snapshot %s (%s). They stay named; the run drains on",
                        ", ".join(tables), reason)  # fmt: skip
            return dict.fromkeys(tables, reason)
        recorded = coverage.read(self.lake)
        left = {g.table for g in recorded.gaps.values()} if recorded is not None else set(tables)
        return {
            table: "copied, but the catalog changed meanwhile: the next run judges it again"
            if table in left
            else None
            for table in tables
        }
