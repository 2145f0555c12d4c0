"""Lake upkeep: compaction, VACUUM and log checkpoints that never take away a kept position.

Why a lake needs it: every window adds one small Parquet file to each table it touches and one
to ``_pglogrepl/windows``, every merge replaces files (or adds deletion vectors), and nothing is
ever deleted. Left alone, reads slow down with the file count, the log grows a version per
window, and replaced files fill the storage. So, for one lake root, per table:

1. **compaction** (``optimize.compact``, bin-packing) once the table passes a file-count,
   small-file or deletion-vector threshold (``Thresholds``). delta-rs applies deletion vectors
   to the rows it rewrites, so compaction also purges the vectors of the files it packs; a file
   it leaves alone (bigger than the target, or alone in its bin) keeps them, and the report says
   how to purge those with Spark (``REORG TABLE ... APPLY (PURGE)``). Measured on Spark-written
   deletion-vector tables (delta-spark 4.4.0, deltalake 1.6.6): Spark and delta-rs read the same
   rows before and after, and the app transactions carry over, so a compaction commit (which
   carries none) belongs to the transaction before it, as ``lake.txnlog`` reads it. A table
   under column mapping, which delta-rs cannot compact, is packed by
   ``lake.mapped_compaction`` (its files without deletion vectors);
2. **VACUUM** in delta-rs's "lite" mode (only files the log removed), with a retention computed
   per table so that every version from the kept position on stays readable (``Keep``,
   ``lake.retention``), and that version's own files protected by name (``keep_versions``).
   Never the "full" mode: it judges unreferenced files by modification time and removed the
   deletion-vector files of versions still kept (measured), and it cannot see removals older
   than the last checkpoint's tombstones;
3. a **checkpoint** at the table's version, so readers replay a short log;
4. **log cleanup** (``cleanup_metadata``, by the table's ``delta.logRetentionDuration``) only
   when, simulated on the listed log, it leaves the kept version readable; else it is skipped and
   the report says why.

How long is long enough is ``lake.retention``'s (the retention rule, and why it is safe): the
age of the version holding the kept position plus a margin, never below a floor that protects
running readers. A kept-hours below that floor is refused (``UnsafeRetentionError``) before
anything is done.

Exclusivity: the caller holds the lake's writer lock (``postgres.locks``), and ``writer_check``
proves it before every commit made here (a ``WriterLockLostError`` stops the upkeep before its
next commit). A lake being drained is maintained by the next run, never concurrently.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.exceptions import LakeError, WriterLockLostError
from airflow_pglogrepl.lake import delta, durability, mapped_compaction, opened_tables
from airflow_pglogrepl.lake.layout import LakePaths, app_id, is_local
from airflow_pglogrepl.lake.mapping import is_mapped
from airflow_pglogrepl.lake.retention import (
    LOG_RETENTION_HOURS,
    MARGIN_HOURS,
    OWN_RETENTION,
    Keep,
    interval_hours,
    kept_versions,
    list_log,
    retention_floor,
    retention_hours,
    table_property,
)
from airflow_pglogrepl.lake.seen_versions import SeenVersions
from airflow_pglogrepl.lake.storage import filesystem
from airflow_pglogrepl.lake.upkeep_report import (
    TableReport,
    UpkeepReport,
    rest,
    rested,
    summary,
    upkeep_level,
)

log = logging.getLogger("airflow_pglogrepl.lake")

WINDOWS = "_pglogrepl/windows"
QUARANTINE = "_pglogrepl/quarantine"  # (lake.quarantine): a file a window while a table is held


@dataclass(frozen=True)
class Thresholds:
    """When a table is compacted: more than ``max_files`` live files, at least
    ``max_small_files`` files under ``small_file_bytes``, or at least ``max_dv_files`` files
    with deletion vectors. ``target_file_bytes`` (None: the table's ``delta.targetFileSize``,
    else 100 MiB) is the size compaction packs towards. The windows table, whose files are one
    row each, is compacted whenever it has two or more."""

    max_files: int = 100
    small_file_bytes: int = 8 * 1024 * 1024
    max_small_files: int = 20
    max_dv_files: int = 10
    target_file_bytes: int | None = None
    # a table's log is checkpointed once it has none, or this many versions since its last one
    # (Delta's own interval): a checkpoint every run is a file per table per run
    checkpoint_every: int = 10
    # a table with no commit since its last upkeep is maintained again after this long (what
    # time alone makes due waits at most that much); until then its log is not read
    recheck_hours: float = 1.0


@opened_tables.reused()
def upkeep(
    root: str,
    slot: str,
    *,
    keep: Keep | None = None,
    thresholds: Thresholds | None = None,
    writer_check: Callable[[], None] | None = None,
) -> UpkeepReport:
    """Compact, vacuum and checkpoint every table of the lake at ``root`` drained from
    ``slot`` (``changes/``, ``state/``, ``history/``, ``_pglogrepl/windows``). The caller holds
    the lake's writer lock; ``writer_check`` proves it before each commit. Refuses
    (``UnsafeRetentionError``) a kept-hours below a table's retention floor before anything is
    done, and a lake another slot owns (``LakeOfAnotherSlotError``)."""
    from airflow_pglogrepl.lake.lake import Lake

    keep = keep or Keep()
    thresholds = thresholds or Thresholds()
    lake = Lake(root, slot, writer_check=writer_check)
    lake.check_owner()
    paths = LakePaths(root)
    seen = SeenVersions(paths.root, app_id(slot))
    targets = [(f"changes/{n}", paths.changes(n)) for n in seen.tables("changes")]
    targets += [(f"state/{n}", paths.state(n)) for n in seen.tables("state")]
    targets += [(f"history/{n}", paths.history(n)) for n in seen.tables("history")]
    for name, uri in ((WINDOWS, paths.windows()), (QUARANTINE, paths.quarantine())):
        if seen.knows(name) or delta.open_table(uri) is not None:
            targets.append((name, uri))
    now = time.time()
    resting = rested(seen, [name for name, _ in targets], now, thresholds.recheck_hours)
    opened = {name: delta.open_table(uri) for name, uri in targets if name not in resting}
    for name in [name for name, table in opened.items() if table is None]:  # its log is gone
        log.warning("upkeep of %s skipped: no Delta table there any more", name)
        seen.forget(name)
        del opened[name]
    targets = [(name, uri) for name, uri in targets if name in resting or name in opened]
    owns = {name: resting[name]["retention"] if name in resting
            else table_property(opened[name], OWN_RETENTION) for name, _ in targets}  # fmt: skip
    floors = {name: retention_floor(name, owns[name], keep) for name, _ in targets}  # refusals
    report = UpkeepReport(
        paths.root, slot, {"lsn": None if keep.lsn is None else str(keep.lsn),
                           "hours": keep.hours, "min_retention_hours": keep.min_retention_hours},
    )  # fmt: skip
    failed: list[str] = []
    for name, uri in targets:
        if name in resting:
            report.tables.append(rest(name, resting[name]))
            continue
        try:
            table_report = _maintain(name, uri, opened.pop(name), app_id(slot), keep,
                                     floors[name], thresholds, lake)  # fmt: skip
        except WriterLockLostError:
            raise  # nothing more may be committed
        except Exception as exc:  # one table's trouble: the others are still maintained
            log.error("upkeep of %s failed (%s: %s); the other tables are maintained", name,
                      type(exc).__name__, exc)  # fmt: skip
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
            report.tables.append(
                TableReport(
                    name, version_before=-1, skipped=[f"failed: {type(exc).__name__}: {exc}"]
                )
            )
            continue
        report.tables.append(table_report)
        # whether the kept position held nothing of the table back: then one that moves on
        # can free nothing more in it until the table moves too
        behind = keep.lsn is None or (table_report.lsn is not None
                                      and table_report.lsn <= int(keep.lsn))  # fmt: skip
        seen.note(name, table_report.version_after, lsn=table_report.lsn, upkeep_at=now,
                  retention=owns[name], kept_all=behind)  # fmt: skip
        # a line per table that changed or has advice; the others are in the closing count
        log.log(upkeep_level(table_report), "upkeep of %s: %s", name, summary(table_report))
    seen.save()
    if failed:
        raise LakeError(
            f"the upkeep of {len(failed)} of {len(targets)} tables of {paths.root} failed, the "
            f"others were maintained: {'; '.join(failed)}. What a failed table's steps committed "
            f"before its error stays (every step is safe alone); the next run tries again. Fix: "
            f"see each table's error above"
        )
    return report


def _maintain(name: str, uri: str, table: Any, app: str, keep: Keep, floor: float,
              thresholds: Thresholds, lake: Any) -> TableReport:  # fmt: skip
    """The upkeep of one table (``table``: it opened), step by step (see the module docstring);
    each step is safe alone, so a table whose upkeep stops between two keeps what the first
    committed. The table is brought up to date between steps by reading only the log entries
    added since (on an object store, opening it again reads every entry since its checkpoint)."""
    table.update_incremental()  # opened before the refusals: what committed since (nothing,
    # under the writer lock) is read, not acted on from an older view
    report = TableReport(name, version_before=int(table.version()))
    sizes = delta.file_sizes(table)
    report.files_before = len(sizes)
    report.small_files_before = sum(s < thresholds.small_file_bytes for s in sizes)
    report.dv_files_before = _dv_files(table)
    table = _compact(name, uri, table, report, thresholds, lake)
    _vacuum(uri, app, table, report, keep, floor, lake)
    table = _checkpoint(uri, table, report, thresholds, lake)
    # again on the log as it is now: the versions VACUUM added hold the kept position too
    listing = list_log(uri)
    kept_now = kept_versions(uri, app, keep, listing, time.time(), [])
    kept = min((v for v in kept_now if v is not None), default=None)
    _clean_log(uri, table, report, kept, lake)
    table.update_incremental()
    report.version_after = int(table.version())
    report.files_after = len(delta.file_sizes(table))
    found = table.transaction_version(app)
    report.lsn = None if found is None else int(found)
    return report


def _compact(name: str, uri: str, table: Any, report: TableReport, thresholds: Thresholds,
             lake: Any) -> Any:  # fmt: skip
    """Compaction once the table passes a threshold (``lake.mapped_compaction`` under column
    mapping, which delta-rs refuses), and the advice to purge what deletion vectors it left;
    returns the table as it is now."""
    reasons = _compaction_reasons(name, report, thresholds)
    if reasons and is_mapped(table):  # delta-rs refuses: packed here (lake.mapped_compaction)
        before = int(table.version())
        target = thresholds.target_file_bytes or int(
            table_property(table, "delta.targetFileSize") or 100 * 1024 * 1024
        )
        packed = mapped_compaction.compact(
            uri, table, small_bytes=thresholds.small_file_bytes, target_bytes=target,
            check_writer=lake.check_writer, commit_properties=_marked("compact"),
            post_commithook_properties=_no_hooks(),
        )  # fmt: skip
        table = _compacted(uri, before, report, f"compacted ({', '.join(reasons)}; column "
                           f"mapping: small files without deletion vectors): {packed.removed} "
                           f"files into {packed.added}")  # fmt: skip
    elif reasons:
        before = int(table.version())
        lake.check_writer()
        metrics = table.optimize.compact(
            target_size=thresholds.target_file_bytes,
            post_commithook_properties=_no_hooks(),
            commit_properties=_marked("compact"),
        )
        table = _compacted(uri, before, report, f"compacted ({', '.join(reasons)}): "
                           f"{metrics.get('numFilesRemoved', 0)} files into "
                           f"{metrics.get('numFilesAdded', 0)}")  # fmt: skip
    else:
        report.skipped.append("compaction: below every threshold")
    report.dv_files_after = _dv_files(table) if report.dv_files_before else 0
    if report.dv_files_after and report.dv_files_after >= thresholds.max_dv_files:
        report.skipped.append(
            f"purge: {report.dv_files_after} files keep deletion vectors (too big or alone to "
            f"be packed without a JVM); purge them with Spark: REORG TABLE delta.`{uri}` "
            f"APPLY (PURGE)"
        )
    return table


def _compacted(uri: str, before: int, report: TableReport, note: str) -> Any:
    """After a compaction commit: its log made durable, the table opened again at its new
    version, and the report saying what was done."""
    _durable(uri, before)
    table = delta.open_table(uri)
    assert table is not None
    report.compacted = int(table.version()) > before
    report.notes.append(note)
    return table


def _compaction_reasons(name: str, report: TableReport, thresholds: Thresholds) -> list[str]:
    if name in (WINDOWS, QUARANTINE):
        return [f"{report.files_before} small files"] if report.files_before >= 2 else []
    reasons = []
    if report.files_before > thresholds.max_files:
        reasons.append(f"{report.files_before} files > {thresholds.max_files}")
    if report.small_files_before >= max(thresholds.max_small_files, 2):
        reasons.append(f"{report.small_files_before} small files")
    if report.dv_files_before >= max(thresholds.max_dv_files, 1) and report.files_before >= 2:
        reasons.append(f"{report.dv_files_before} files with deletion vectors")
    return reasons


def _vacuum(uri: str, app: str, table: Any, report: TableReport, keep: Keep, floor: float,
            lake: Any) -> None:  # fmt: skip
    """VACUUM with the retention that leaves every version from the kept position readable
    (``lake.retention``), and that version's own files protected by name."""
    listing = list_log(uri)
    now = time.time()
    by_lsn, by_hours = kept_versions(uri, app, keep, listing, now, report.notes)
    retention = retention_hours(floor, keep, listing, by_lsn, now)
    kept = min((v for v in (by_lsn, by_hours) if v is not None), default=None)
    report.keep_version = kept
    if math.isfinite(retention):
        report.retention_hours = math.ceil(retention)
        _vacuum_files(uri, table, report, kept, lake)
    else:
        report.skipped.append(f"vacuum: the log no longer dates version {by_lsn}")


def _vacuum_files(uri: str, table: Any, report: TableReport, kept: int | None,
                  lake: Any) -> None:  # fmt: skip
    """The VACUUM itself, in delta-rs's "lite" mode: a dry run first (nothing to remove: no
    commit), then the commit, made durable like the drain's."""
    assert report.retention_hours is not None
    options: dict[str, Any] = {
        "retention_hours": report.retention_hours,
        "enforce_retention_duration": False,  # the floor is the check (retention_floor)
        "full": False,
        "keep_versions": None if kept is None else [kept],
    }
    doomed = table.vacuum(dry_run=True, **options)
    if not doomed:
        report.skipped.append(
            f"vacuum: no file removed more than {report.retention_hours} hours ago"
        )
        return
    sizes = _file_sizes(uri, doomed)
    before = int(table.version())
    lake.check_writer()
    removed = table.vacuum(
        dry_run=False,
        post_commithook_properties=_no_hooks(),
        commit_properties=_marked("vacuum"),
        **options,
    )
    _durable(uri, before)
    report.files_removed = len(removed)
    report.bytes_removed = sum(sizes.get(path, 0) for path in removed)


def _checkpoint(uri: str, table: Any, report: TableReport, thresholds: Thresholds,
                lake: Any) -> Any:  # fmt: skip
    """A checkpoint at the table's version, so readers replay a short log: when it has none,
    every ``checkpoint_every`` versions, or when its last is older than the log retention;
    returns the table as it is now."""
    table.update_incremental()
    listing = list_log(uri)
    version = int(table.version())
    last = max(listing.checkpoints, default=None)
    log_hours = interval_hours(table_property(table, "delta.logRetentionDuration"),
                               LOG_RETENTION_HOURS) or 0  # fmt: skip
    stale = last is not None and listing.checkpoints[last] < time.time() - log_hours * 3600
    # a checkpoint older than the log retention is renewed too: log cleanup stops at one
    if last is None or stale or version - last >= max(thresholds.checkpoint_every, 1):
        lake.check_writer()
        table.create_checkpoint()
        last = version
    else:
        report.skipped.append(f"checkpoint: {version - last} versions since the last one "
                              f"(every {thresholds.checkpoint_every})")  # fmt: skip
    report.checkpoint = last
    return table


def _clean_log(uri: str, table: Any, report: TableReport, kept: int | None, lake: Any) -> None:
    """``cleanup_metadata`` when, simulated on the listed log, the kept version stays readable.

    The simulation is the worst case: every commit file and checkpoint below the newest
    checkpoint that is older than ``delta.logRetentionDuration`` (less a margin) is taken as
    deleted. delta-rs deletes no more than that (it stops at a checkpoint older than the
    cutoff, so it often deletes less)."""
    listing = list_log(uri)
    hours = interval_hours(table_property(table, "delta.logRetentionDuration"),
                           LOG_RETENTION_HOURS)  # fmt: skip
    assert hours is not None
    cutoff = time.time() - (hours - MARGIN_HOURS) * 3600
    last = max(listing.checkpoints, default=None)
    if last is None:
        report.skipped.append("log cleanup: no checkpoint")
        return
    gone = {v for v, stamp in listing.commits.items() if v < last and stamp <= cutoff}
    gone_checkpoints = {v for v, s in listing.checkpoints.items() if v < last and s <= cutoff}
    if not gone and not gone_checkpoints:
        report.skipped.append(f"log cleanup: no log entry older than {hours:g} hours")
        return
    after = listing.readable_from(gone, gone_checkpoints)
    if kept is not None and (after is None or after > kept):
        report.skipped.append(
            f"log cleanup: it would leave the log readable from version {after} only, and "
            f"version {kept} holds the kept position; set a longer delta.logRetentionDuration "
            f"on {report.table} (now {hours:g} hours) or keep less"
        )
        return
    lake.check_writer()
    table.cleanup_metadata()
    report.log_cleaned = True


def _dv_files(table: Any) -> int:
    """How many live files carry a deletion vector (read batch by batch)."""
    import pyarrow as pa

    if "deletionVectors" not in (table.protocol().reader_features or []):
        return 0
    reader = pa.RecordBatchReader.from_stream(table.deletion_vectors())
    return sum(batch.num_rows for batch in reader)


def _file_sizes(uri: str, paths: list[str]) -> dict[str, int]:
    from pyarrow import fs

    system, base = filesystem(uri)
    # delta-rs names the files relative to the table (absolute ones are taken as they are)
    located = [filesystem(p)[1] if "://" in p or p.startswith("/") else f"{base}/{p}"
               for p in paths]  # fmt: skip
    infos = system.get_file_info(located)
    return {p: int(i.size) for p, i in zip(paths, infos, strict=True)
            if i.type == fs.FileType.File and i.size is not None}  # fmt: skip


def _no_hooks() -> Any:
    """No checkpoint or log cleanup as a side effect of a commit: the upkeep does both itself,
    and a log cleanup must first be judged against the kept position."""
    from deltalake import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def _marked(step: str) -> Any:
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={"pglogrepl.upkeep": step})


def _durable(uri: str, before: int) -> None:
    if is_local(uri):
        durability.make_log_durable(uri, after=before)
