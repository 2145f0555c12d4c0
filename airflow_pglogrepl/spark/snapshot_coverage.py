"""What a snapshot records of the relations it holds whole (``lake.coverage``), read as the
catalog stood at the snapshot.

An initial snapshot's catalog was verified unchanged before its commit; a re-snapshot's is
verified here: a table attached, detached, added or removed between the snapshot and now
would make the record claim what the copy does not hold, so the record is then left as it
was and the next drain judges those tables again (the copy itself stands).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.postgres.snapshot_guard import SnapshotGuard

__all__ = ["record_coverage"]

log = logging.getLogger("airflow_pglogrepl.snapshot")


def record_coverage(lake: Lake, guard: SnapshotGuard, publications: Sequence[str], point: LSN,
                    copied: Sequence[str], *, initial: bool) -> None:  # fmt: skip
    """Record the ``copied`` tables (every relation, for an ``initial`` snapshot) as whole."""
    from airflow_pglogrepl.exceptions import CatalogChangedError
    from airflow_pglogrepl.pipeline.coverage import after_snapshot
    from airflow_pglogrepl.postgres.coverage import publication_coverage

    now = publication_coverage(guard.conn, publications)
    if not initial:
        try:
            guard.verify()
        except CatalogChangedError as exc:
            log.warning("the catalog changed since the re-snapshot's point, so %s stay reported "
                        "incomplete until a drain judges them again: %s", ", ".join(copied),
                        exc)  # fmt: skip
            return
    after_snapshot(lake, now, point, copied, initial=initial)
