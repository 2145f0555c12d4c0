"""``LakeUpkeepOperator`` against a live publisher: it maintains the lake under the writer lock,
skips (touching nothing) while a drain or snapshot holds that lock, refuses an unsafe retention
before anything is done, and a lock lost before a commit stops it there."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from airflow_pglogrepl.exceptions import UnsafeRetentionError, WriterLockLostError
from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.lake.retention import Keep
from airflow_pglogrepl.lake.upkeep import Thresholds, upkeep
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.operators.upkeep import LakeUpkeepOperator
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import context
from tests.support.boundary import task_fails_with
from tests.support.upkeep import Built, log_names, versions

A = "public.a"


def lake_of(root: Path, slot: str) -> Built:
    """A lake of ``slot`` with nine one-row windows of one table."""
    built = Built(root, slot)
    for end in range(10, 100, 10):
        built.window(end, {A: [end]})
    return built


def snapshot(built: Built) -> dict[str, tuple[int, list[str]]]:
    uris = [built.paths.changes(A), built.paths.windows()]
    return {uri: (versions(uri), log_names(uri)) for uri in uris}


def operator(conn_id: str, slot: str, lake_root: str, **kwargs: object) -> LakeUpkeepOperator:
    return LakeUpkeepOperator(task_id="upkeep", postgres_conn_id=conn_id, slot_name=slot,
                              lake=lake_root, max_files=4, max_small_files=3,
                              **kwargs)  # type: ignore[arg-type]  # fmt: skip


def test_the_upkeep_maintains_the_lake_under_the_writer_lock(
    publisher_conn_id: str, slot_name: str, tmp_path: Path
) -> None:
    built = lake_of(tmp_path / "lake", slot_name)
    position = built.lake.position()
    task = operator(publisher_conn_id, slot_name, built.root, keep_lsn="0/50")

    result = task.execute(context())

    tables = {t["table"]: t for t in result["tables"]}
    assert tables[f"changes/{A}"]["compacted"] and tables[f"changes/{A}"]["files_after"] == 1
    assert tables["_pglogrepl/windows"]["compacted"]
    assert tables[f"changes/{A}"]["checkpoint"] == versions(built.paths.changes(A))
    assert built.lake.position() == position and result["keep"]["lsn"] == "0/50"
    with replication_hook(publisher_conn_id).writer_lock(slot_name) as lock:
        lock.check()  # released when the task ended
    # 0/50 held versions of changes/A back: maintained again once the position passes them all,
    # then it rests while nothing commits to it (unless asked to recheck every run)
    caught_up = operator(publisher_conn_id, slot_name, built.root, keep_lsn="0/5A")
    caught_up.execute(context())
    again = {t["table"]: t for t in caught_up.execute(context())["tables"]}
    assert again[f"changes/{A}"]["skipped"][0].startswith("upkeep: no commit since")
    eager = operator(publisher_conn_id, slot_name, built.root, keep_lsn="0/5A", recheck_hours=0)
    again = {t["table"]: t for t in eager.execute(context())["tables"]}
    assert not again[f"changes/{A}"]["skipped"][0].startswith("upkeep: no commit since")


def test_a_lake_being_written_is_skipped_and_left_untouched(
    publisher_conn_id: str, slot_name: str, tmp_path: Path
) -> None:
    built = lake_of(tmp_path / "lake", slot_name)
    before = snapshot(built)
    busy = pytest.raises(AirflowSkipException, match=r"skipped: .*being written by .*drain")
    with replication_hook(publisher_conn_id).writer_lock(slot_name, role="drain"), busy:
        operator(publisher_conn_id, slot_name, built.root).execute(context())
    assert snapshot(built) == before


def test_an_unsafe_retention_fails_the_task_before_anything_is_done(
    publisher_conn_id: str, slot_name: str, tmp_path: Path
) -> None:
    built = lake_of(tmp_path / "lake", slot_name)
    before = snapshot(built)
    task = operator(publisher_conn_id, slot_name, built.root, keep_hours=2, min_retention_hours=24)
    with task_fails_with(UnsafeRetentionError, match=r"changes/public\.a .*2 hours.*Fix"):
        task.execute(context())
    assert snapshot(built) == before


def test_a_lock_lost_before_a_commit_stops_the_upkeep_there(
    publisher: PgCluster, publisher_conn_id: str, slot_name: str, tmp_path: Path
) -> None:
    built = lake_of(tmp_path / "lake", slot_name)
    before = snapshot(built)
    with replication_hook(publisher_conn_id).writer_lock(slot_name) as lock:
        publisher.execute("SELECT pg_terminate_backend(%s)", (lock.pid,))
        with pytest.raises(WriterLockLostError):
            upkeep(built.root, slot_name, keep=Keep(lsn=LSN(90)),
                   thresholds=Thresholds(max_files=4), writer_check=lock.check)  # fmt: skip
    assert snapshot(built) == before
