"""``LakeUpkeepOperator``: keep a slot's lake healthy (compaction, VACUUM, checkpoints), never
while a drain or snapshot writes it.

The work is ``lake.upkeep`` (no JVM: delta-rs). This operator adds the exclusivity: it holds the
lake's writer lock on the publisher, the same advisory lock the drain and the snapshot hold, so
the upkeep's commits never race theirs, and every commit it makes is preceded by a proof that
the lock is still held. When a drain or snapshot holds the lock, the task is skipped (not
failed): nothing is wrong, the lake is simply maintained by the next run, and a failure would
page someone for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl import metrics
from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook

DAY_HOURS = 24.0


class LakeUpkeepOperator(TaskBoundary, BaseOperator):
    """Compact, vacuum and checkpoint every table of a slot's lake (``changes/``, ``state/``,
    ``_pglogrepl/windows``), under the lake's writer lock.

    A table is compacted once it passes a threshold (more than ``max_files`` live files, at
    least ``max_small_files`` files under ``small_file_bytes``, or at least ``max_dv_files``
    files with deletion vectors); the windows table whenever it has two files or more. VACUUM
    keeps every version from the kept position on readable: from the version holding
    ``keep_lsn`` and from the version current ``keep_hours`` ago, whichever is older. It never
    keeps removed files for less than ``min_retention_hours`` (or a table's own
    ``delta.deletedFileRetentionDuration``): a ``keep_hours`` below that fails the task, before
    anything is done, with ``UnsafeRetentionError``. Log cleanup runs only when the kept
    version's log survives it. See docs/drain.md, "Keeping the lake healthy".

    When another run (a drain or a snapshot) holds the lock, the task is skipped with a log line
    saying who holds it: the lake is maintained by the next run. Returns the report (per table:
    files and versions before and after, files and bytes vacuumed, what was skipped and why).

    :param postgres_conn_id: the publisher's Airflow connection (database of the slot): where
        the writer lock is held.
    :param slot_name: the slot whose lake it is.
    :param lake: the lake root: a path, or ``s3://bucket/prefix`` (docs/object-storage.md).
    :param lake_conn_id: the Airflow connection (type ``aws``) of the lake's object store; None:
        a local lake, or the store's defaults (``AWS_*`` variables, the instance's role).
    :param keep_lsn: keep every version from the one that holds this LSN (None: not asked).
    :param keep_hours: keep every version of the last this many hours (None: not asked).
    :param min_retention_hours: never vacuum a file removed less than this many hours ago
        (default 168, Delta's own: a reader running that long keeps its snapshot).
    :param max_files: compact a table with more live files than this.
    :param max_small_files: compact a table with at least this many small files.
    :param small_file_bytes: what a small file is.
    :param max_dv_files: compact a table with at least this many files with deletion vectors.
    :param target_file_bytes: the size compaction packs towards (None: the table's
        ``delta.targetFileSize``, else 100 MiB).
    :param checkpoint_every: checkpoint a table's log once it has none, or this many versions
        since its last checkpoint.
    :param recheck_hours: a table with no commit since its last upkeep rests (its log is not
        read) for this long; what time alone makes due (a VACUUM, a log cleanup) waits at most
        that much. 0: every table is maintained on every run.
    :param database: the slot's database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "postgres_conn_id", "slot_name", "lake", "keep_lsn", "keep_hours",
        "min_retention_hours", "max_files", "max_small_files", "database", "lake_conn_id",
    )  # fmt: skip
    ui_color = "#e8f6f3"

    def __init__(
        self,
        *,
        postgres_conn_id: str,
        slot_name: str,
        lake: str,
        keep_lsn: str | None = None,
        keep_hours: float | None = 7 * DAY_HOURS,
        min_retention_hours: float = 7 * DAY_HOURS,
        max_files: int = 100,
        max_small_files: int = 20,
        small_file_bytes: int = 8 * 1024 * 1024,
        max_dv_files: int = 10,
        target_file_bytes: int | None = None,
        checkpoint_every: int = 10,
        recheck_hours: float = 1.0,
        database: str | None = None,
        lake_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if "{{" not in str(lake):  # a lake with credentials in it fails the DAG's parse
            from airflow_pglogrepl.hooks.object_store import check_lake_uri

            check_lake_uri(str(lake))
        self.lake_conn_id = lake_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.slot_name = slot_name
        self.lake = lake
        self.keep_lsn = keep_lsn
        self.keep_hours = keep_hours
        self.min_retention_hours = min_retention_hours
        self.max_files = max_files
        self.max_small_files = max_small_files
        self.small_file_bytes = small_file_bytes
        self.max_dv_files = max_dv_files
        self.target_file_bytes = target_file_bytes
        self.checkpoint_every = checkpoint_every
        self.recheck_hours = recheck_hours
        self.database = database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from airflow_pglogrepl.exceptions import LakeWriterBusyError
        from airflow_pglogrepl.lake.retention import Keep
        from airflow_pglogrepl.lake.upkeep import Thresholds, upkeep
        from airflow_pglogrepl.lsn import LSN

        keep = Keep(
            lsn=None if _unset(self.keep_lsn) else LSN(str(self.keep_lsn)),
            hours=None if _unset(self.keep_hours) else float(str(self.keep_hours)),
            min_retention_hours=float(str(self.min_retention_hours)),
        )
        thresholds = Thresholds(
            max_files=int(str(self.max_files)),
            small_file_bytes=int(self.small_file_bytes),
            max_small_files=int(str(self.max_small_files)),
            max_dv_files=int(self.max_dv_files),
            target_file_bytes=self.target_file_bytes,
            checkpoint_every=int(self.checkpoint_every),
            recheck_hours=float(self.recheck_hours),
        )
        from airflow_pglogrepl.hooks.object_store import check_bucket, lake_store
        from airflow_pglogrepl.lake import storage

        store = lake_store(self.lake_conn_id, str(self.lake))
        if store is not None:
            check_bucket(store, str(self.lake))
        hook = replication_hook(self.postgres_conn_id, self.database)
        began = time.monotonic()
        try:
            with storage.using(store), hook.writer_lock(str(self.slot_name), role="upkeep") as lock:
                report = upkeep(str(self.lake), str(self.slot_name), keep=keep,
                                thresholds=thresholds, writer_check=lock.check)  # fmt: skip
        except LakeWriterBusyError as busy:
            self.log.info("Lake upkeep skipped, the next run maintains the lake: %s", busy)
            raise AirflowSkipException(f"lake upkeep skipped: {busy}") from None
        result = report.to_dict()
        metrics.upkeep(str(self.slot_name), result, time.monotonic() - began)
        self.log.info(
            "Lake %s maintained: %s tables looked at, %s compacted, %s files (%s bytes) "
            "vacuumed; a table that needed nothing is logged at DEBUG",
            result["root"], len(result["tables"]), result["compacted"], result["files_removed"],
            result["bytes_removed"],
        )  # fmt: skip
        return result


def _unset(value: object) -> bool:
    """None, or a template that rendered to nothing (``None`` as text, or empty)."""
    return value is None or str(value).strip() in ("", "None")
