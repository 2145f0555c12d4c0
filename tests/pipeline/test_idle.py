"""Whether a drain run has anything to do, judged on the worker without Spark
(``pipeline.idle``), against a live slot and a real lake: idle when nothing the publications
produce was committed past the slot (WAL of other tables does not count) or when no WAL was
written at all; not idle, so the application runs, when a published change waits, a merge
waits, the lake is not where the slot is, the slot is in use, holds more WAL than an idle run
may leave or is close to being lost, a publication is missing, another run holds the lake's
writer lock, or the judgement itself fails. An idle run's summary has the application's keys."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import SlotInfo
from airflow_pglogrepl.pipeline.coverage import CoverageCheck
from airflow_pglogrepl.pipeline.idle import IDLE_WAL_BYTES, Idle, IdleCheck, idle_summary
from airflow_pglogrepl.tables import TableRef
from tests.support.sources import Source

# pgoutput sends nothing for a transaction without a published change from 15 on
pytestmark = pytest.mark.pgversion


class Judge:
    """The source's slot and a lake at its confirmed position, judged as a run would."""

    def __init__(self, source: Source, tmp_path: Path) -> None:
        source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
        source.sql("CREATE TABLE other (id int PRIMARY KEY, v text)")
        source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
        self.source, self.hook = source, source.hook()
        self.root = str(tmp_path / "lake")
        self.lake = Lake(self.root, source.slot)
        self.confirmed = self.slot().confirmed_flush_lsn
        assert self.confirmed is not None

    def slot(self) -> SlotInfo:
        return self.hook.get_slot(self.source.slot)

    def commit_lake(self, *, with_change: bool = False) -> None:
        """The lake's position at the slot's (with a change of ``t`` to merge, if asked)."""
        window = Window(self.lake, LSN(0))
        if with_change:
            window.write(TableRef("public", "t"), pa.table({
                "id": pa.array([1], pa.int64()), "_op": pa.array(["I"]),
                "_commit_lsn": pa.array([int(self.confirmed) - 1], pa.int64()),
                "_seq": pa.array([0], pa.int64())}))  # fmt: skip
        window.commit(self.confirmed, transactions=int(with_change), changes=int(with_change))
        # what the publications cover, recorded as a drain run records it before its windows
        CoverageCheck(self.hook, self.lake, [self.source.publication]).run()

    def run(self, *, materialize: bool = True, max_wal_bytes: int = IDLE_WAL_BYTES,
            publications: list[str] | None = None,
            hook: DsnReplicationHook | None = None) -> Idle | None:  # fmt: skip
        return self.check(
            hook=hook,
            materialize=materialize,
            max_wal_bytes=max_wal_bytes,
            publications=publications,
        ).run(self.slot())

    def check(self, *, materialize: bool = True, max_wal_bytes: int = IDLE_WAL_BYTES,
              publications: list[str] | None = None,
              hook: DsnReplicationHook | None = None) -> IdleCheck:  # fmt: skip
        return IdleCheck(hook or self.hook, lake_root=self.root,
                         publications=publications or [self.source.publication],
                         materialize=materialize, max_wal_bytes=max_wal_bytes)  # fmt: skip


@pytest.fixture
def judge(source: Source, tmp_path: Path) -> Judge:
    return Judge(source, tmp_path)


def test_wal_of_tables_outside_the_publications_leaves_a_run_idle(
    judge: Judge, caplog: pytest.LogCaptureFixture
) -> None:
    judge.commit_lake()
    judge.source.sql("INSERT INTO other SELECT g, 'o' FROM generate_series(1, 50) g")
    idle = judge.run()
    assert idle is not None and idle.confirmed == judge.confirmed, caplog.text
    assert idle.flush > idle.confirmed
    assert idle.reason.startswith(f"no published change in the {idle.flush - idle.confirmed} "
                                  f"WAL bytes after the slot's confirmed_flush_lsn")  # fmt: skip
    assert judge.slot().confirmed_flush_lsn == judge.confirmed  # the peek moved nothing
    # the bound on the WAL an idle run may leave the slot holding
    assert judge.run(max_wal_bytes=0) is None
    assert "more than 0: the application drains" in caplog.text


def test_a_table_added_to_the_publication_is_not_idle_though_it_sends_nothing(
    judge: Judge, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: ``ALTER PUBLICATION ... ADD TABLE`` of a table holding rows sends no change, so
    every run was skipped as idle and the lake never learnt that the table's rows were
    missing. Now the run is submitted and names the table."""
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.drain")
    judge.commit_lake()
    judge.source.sql("INSERT INTO other SELECT g, 'o' FROM generate_series(1, 50) g")
    assert judge.run() is not None
    judge.source.sql(f"ALTER PUBLICATION {judge.source.publication} ADD TABLE other")
    assert judge.run() is None
    assert "the publications cover other tables or partitions than the lake records" in caplog.text


def test_a_published_change_is_drained(judge: Judge, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.drain")
    judge.commit_lake()
    judge.source.sql("INSERT INTO t VALUES (1, 'published')")
    assert judge.run() is None
    assert "has changes to drain" in caplog.text


def test_no_wal_past_the_slot_is_idle_without_a_peek(judge: Judge) -> None:
    """Judged on a slot whose confirmed position is ahead of the server's flush (the lake at
    the same place): nothing can have been written past it."""
    far = LSN(int(judge.hook.flush_lsn()) + (1 << 30))
    judge.confirmed = far
    judge.commit_lake()
    slot = dataclasses.replace(judge.slot(), confirmed_flush_lsn=far)
    idle = judge.check(publications=["no_such_pub"]).judge(slot)
    assert idle is not None and idle.reason == (
        "no WAL was written after the slot's confirmed_flush_lsn"
    )


def test_a_lake_not_where_the_slot_is_is_the_applications(judge: Judge) -> None:
    assert judge.run() is None  # no lake yet
    judge.confirmed = LSN(int(judge.confirmed) - 8)
    judge.commit_lake()  # behind the slot
    assert judge.run() is None


def test_a_merge_waiting_is_not_idle_unless_the_run_does_not_merge(judge: Judge) -> None:
    judge.commit_lake(with_change=True)
    assert judge.run(materialize=True) is None
    assert judge.run(materialize=False) is not None


@pytest.mark.parametrize(
    ("change", "logged"),
    [({"active": True, "active_pid": 4242}, "in use by backend 4242"),
     ({"safe_wal_size": IDLE_WAL_BYTES - 1}, "is lost after"),
     ({"confirmed_flush_lsn": None}, None)],
)  # fmt: skip
def test_a_slot_in_use_or_close_to_being_lost_is_not_idle(
    judge: Judge, change: dict[str, object], logged: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.drain")
    judge.commit_lake()
    judge.source.sql("INSERT INTO other VALUES (1, 'o')")
    assert judge.run() is not None  # idle as it is
    # the slot as read under the lake's writer lock (IdleCheck.run reads it again there)
    slot = dataclasses.replace(judge.slot(), **change)
    assert judge.check().judge(slot) is None
    assert logged is None or logged in caplog.text


def test_a_missing_publication_is_not_idle(judge: Judge, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.drain")
    judge.commit_lake()
    judge.source.sql("INSERT INTO other VALUES (1, 'o')")
    assert judge.run(publications=[judge.source.publication, "gone_pub"]) is None
    assert "publication(s) gone_pub missing" in caplog.text


def test_a_lake_another_run_writes_or_a_failed_judgement_is_not_idle(
    judge: Judge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.drain")
    judge.commit_lake()
    with judge.hook.writer_lock(judge.source.slot, role="snapshot"):
        assert judge.run() is None
    assert "another run holds the writer lock" in caplog.text
    assert judge.run() is not None  # free again
    unreachable = DsnReplicationHook("host=127.0.0.1 port=1 dbname=x user=u connect_timeout=2")
    assert judge.run(hook=unreachable) is None
    assert "could not tell whether slot" in caplog.text and "submitting" in caplog.text


def test_an_idle_runs_summary_has_the_applications_keys() -> None:
    idle = Idle(LSN(0x100), LSN(0x180), "nothing")
    merged = idle_summary("s", idle, materialize=True, started=time.monotonic())
    assert merged["slot"] == "s" and merged["windows"] == 0 and merged["changes"] == 0
    assert merged["confirmed_flush_lsn_before"] == merged["confirmed_flush_lsn_after"] == "0/100"
    assert merged["lag_bytes_left"] == 0x80 and merged["spark_start_s"] is None
    assert merged["materialized"] == {} and merged["materialize_s"] == 0.0
    unmerged = idle_summary("s", idle, materialize=False, started=time.monotonic())
    assert "materialized" not in unmerged and unmerged["spark_start_s"] is None
