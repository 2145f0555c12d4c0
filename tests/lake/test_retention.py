"""The retention rule on real Delta tables: VACUUM keeps every version from the kept position
on; a retention below the floor is refused before anything is done; log cleanup never takes the
kept version's log.

Time is simulated by ageing a table's log: each version's commit file, commit timestamp and the
removal stamps it wrote are moved back by the hours given, as if the lake had run that long.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import UnsafeRetentionError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.cut import consistent_cut, read_cut
from airflow_pglogrepl.lake.retention import Keep
from airflow_pglogrepl.lake.txnlog import TxnLog
from airflow_pglogrepl.lake.upkeep import Thresholds, upkeep
from airflow_pglogrepl.lsn import LSN
from tests.support.upkeep import APP, SLOT, Built, age, ids, log_names

A, B = "public.a", "public.b"
# No floor and no kept hours: what is kept is decided by the kept LSN alone.
BY_LSN = dict(hours=None, min_retention_hours=0.0)
EAGER = Thresholds(max_files=4, max_small_files=3, max_dv_files=1)


def test_vacuum_keeps_every_version_from_the_kept_position(lake_uri: str) -> None:
    built = Built(lake_uri)
    state = built.paths.state(A)
    for end in (10, 20, 30, 40, 50):
        built.window(end, {A: [end]})
        built.state(A, end, list(range(end)))
    # state versions 0..4 hold 10..50, each removing the files of the one before it
    age(state, {0: 96, 1: 72, 2: 48, 3: 24})
    report = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(30), **BY_LSN))

    table = {t.table: t for t in report.tables}[f"state/{A}"]
    assert table.keep_version == 2 and table.retention_hours in (49, 50)  # 48 hours, plus margin
    assert table.files_removed == 1 and table.bytes_removed > 0  # version 0's file only
    for version, end in ((2, 30), (3, 40), (4, 50)):  # every version from the kept one on
        assert ids(state, version) == list(range(end))
    assert ids(state, 1) == list(range(20))  # removed 48 hours ago: inside the margin
    with pytest.raises(Exception, match=r"(?i)not found|no such file"):
        ids(state, 0)  # older than the kept position: allowed to break, and it did
    # the cut still reads the lake at the kept position and at its newest
    assert ids(state, TxnLog(state, APP).at_or_below(30).version) == list(range(30))  # type: ignore[union-attr]
    assert read_cut(consistent_cut(built.root, slot=SLOT))[A].num_rows == 50


def test_kept_hours_below_the_floor_are_refused_before_anything_is_done(tmp_path: Path) -> None:
    built = Built(tmp_path / "lake")
    for end in range(10, 60, 10):
        built.window(end, {A: [end]})
    built.state(B, 50, [1], **{"delta.deletedFileRetentionDuration": "interval 30 days"})
    uris = [built.paths.changes(A), built.paths.state(B), built.paths.windows()]
    logs = {uri: log_names(uri) for uri in uris}

    with pytest.raises(UnsafeRetentionError, match=r"changes/public\.a .*1 hours.*"
                       r"min_retention_hours \(24\).*Fix"):  # fmt: skip
        upkeep(built.root, SLOT, keep=Keep(hours=1, min_retention_hours=24), thresholds=EAGER)
    with pytest.raises(UnsafeRetentionError, match=r"state/public\.b .*200 hours.*"
                       r"deletedFileRetentionDuration \(720 hours\)"):  # fmt: skip
        upkeep(built.root, SLOT, keep=Keep(hours=200, min_retention_hours=24), thresholds=EAGER)
    assert {uri: log_names(uri) for uri in uris} == logs  # no commit, no checkpoint


def test_log_cleanup_never_removes_the_kept_versions_log(tmp_path: Path) -> None:
    built = Built(tmp_path / "lake")
    config = {**delta.KEEP_LOGS, "delta.logRetentionDuration": "interval 2 hours"}
    changes = built.paths.changes(A)
    state = built.paths.state(A)
    for end in range(10, 90, 10):
        built.window(end, {A: [end]})
        built.state(A, end, [end], **config)
        if end == 40:
            delta.open_table(state).create_checkpoint()  # type: ignore[union-attr]
    age(state, {v: 100 - 10 * v for v in range(8)})  # all older than the log retention
    checkpoint = os.path.join(state, "_delta_log", f"{3:020d}.checkpoint.parquet")
    os.utime(checkpoint, (time.time() - 70 * 3600, time.time() - 70 * 3600))

    kept = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(30), **BY_LSN))
    assert TxnLog(state, APP).at_or_below(30).version == 2  # type: ignore[union-attr]
    assert ids(state, 2) == [30]  # delta-rs would have removed its log (below checkpoint 3)
    table = {t.table: t for t in kept.tables}[f"state/{A}"]
    assert not table.log_cleaned and "version 2 holds the kept position" in " ".join(table.skipped)

    latest = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(80), **BY_LSN))
    table = {t.table: t for t in latest.tables}[f"state/{A}"]
    assert table.log_cleaned and "00000000000000000000.json" not in log_names(state)
    assert ids(state) == [80] and ids(changes) == list(range(10, 90, 10))
