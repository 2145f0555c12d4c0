"""What ``merge.materialize`` decides before any Spark job, on real Delta tables and without a
JVM: which tables wait for their merge (read from the Delta logs alone), Spark asked for only
when a batch needs it (a run of small batches starts none), a batch reduced against a state
that moved since refused rather than merged, a table merged already left alone, and the
columns a changelog recorded as added with the value earlier rows hold. The merges Spark runs
are tested in tests/merge/test_reduce.py (``apply``) and the lake's tests (``materialize``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.merge.materialize import (
    Added,
    added_columns,
    materialize,
    materialize_table,
    merge_reduced,
    pending_tables,
)
from airflow_pglogrepl.tables import TableRef
from tests.support.keyed import KeyedBatches

T = TableRef("public", "t")


class SparkAskedError(Exception):
    """Raised by a Spark that must not be started."""


def no_spark() -> None:
    raise SparkAskedError


@pytest.fixture
def batches(tmp_path: Path) -> KeyedBatches:
    return KeyedBatches(Lake(str(tmp_path / "lake"), "s"), T)


def test_a_lake_without_commits_has_nothing_to_merge(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    assert pending_tables(lake) == []
    assert materialize(no_spark, lake) == {} and materialize(no_spark, lake, tables=["x"]) == {}


def test_small_batches_are_merged_without_spark_and_then_nothing_waits(
    batches: KeyedBatches,
) -> None:
    end = batches.inserts(range(1, 11))
    assert pending_tables(batches.lake) == ["public.t"]
    assert materialize(no_spark, batches.lake) == {"public.t": str(end)}
    assert batches.state() == batches.model
    assert pending_tables(batches.lake) == [] and materialize(no_spark, batches.lake) == {}
    end = batches.updates_and_deletes(range(1, 11), "u")
    assert pending_tables(batches.lake) == ["public.t"]
    assert materialize(no_spark, batches.lake, tables=["public.t"]) == {"public.t": str(end)}
    assert batches.state() == batches.model


def test_a_state_another_writer_moved_back_waits_again(batches: KeyedBatches) -> None:
    """Which tables wait is decided from a record of what each log was at the last look
    (``lake.seen_versions``): a commit the record never heard of still counts."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    first = batches.inserts(range(1, 4))
    batches.updates_and_deletes(range(1, 4), "u")
    materialize(no_spark, batches.lake)
    assert pending_tables(batches.lake) == []
    lake = batches.lake
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    write_deltalake(lake.paths.state(T), rows, mode="overwrite", schema_mode="overwrite",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(lake.app, int(first))]))  # fmt: skip
    assert pending_tables(lake) == ["public.t"]


def test_spark_is_asked_for_only_when_a_batch_needs_it(batches: KeyedBatches) -> None:
    batches.inserts(range(1, 11))
    with pytest.raises(SparkAskedError):
        materialize(no_spark, batches.lake, small_rows=0)  # every merge by Spark
    assert batches.lake.state_version(T) is None  # nothing merged meanwhile
    assert materialize(no_spark, batches.lake, tables=[]) == {}


def test_a_table_merged_already_is_left_alone_without_spark(batches: KeyedBatches) -> None:
    end = batches.inserts(range(1, 4))
    materialize(no_spark, batches.lake)
    assert materialize_table(None, batches.lake, "public.t", end) == end
    reduced = arrow_merge.Reduced("public.t", end, None, ("id",), ("v",), pa.table({}), 0)
    assert merge_reduced(None, batches.lake, reduced) == end


def test_a_batch_reduced_against_a_state_that_moved_since_is_refused(
    batches: KeyedBatches,
) -> None:
    """Merged by another run between the reduction and Spark's MERGE: merging it again would
    apply the range twice."""
    first = batches.inserts(range(1, 4))
    end = batches.updates_and_deletes(range(1, 4), "u")
    materialize(no_spark, batches.lake, tables=["public.t"])  # the state is at `end` now
    stale = arrow_merge.Reduced("public.t", LSN(int(end) + 100), int(first), ("id",), ("v",),
                                pa.table({}), 1)  # fmt: skip
    with pytest.raises(LakeCommitConflictError, match=rf"but this run wrote its rows against "
                       rf"{first}: another writer committed there since"):  # fmt: skip
        merge_reduced(None, batches.lake, stale)
    assert batches.lake.state_version(T) == end


def test_the_columns_a_changelog_recorded_as_added_and_their_fill() -> None:
    schema = pa.schema([
        pa.field("id", pa.int64()),
        pa.field("v", pa.string()).with_metadata({"pglogrepl.added": "256:3",
                                                  "pglogrepl.fill": "before"}),
        pa.field("w", pa.int64()).with_metadata({"pglogrepl.added": "300:0"}),
        pa.field("_commit_lsn", pa.int64()).with_metadata({"pglogrepl.added": "1:1"}),
    ])  # fmt: skip
    assert added_columns(schema) == [Added("v", (256, 3), "before"), Added("w", (300, 0), None)]
    assert added_columns(pa.schema([pa.field("id", pa.int64())])) == []


class _StalledSpark:
    """A session whose merges stall: its context is the watchdog's, and the merge (patched in
    below) commits first or not, then fails as a cancelled job group does."""

    class sparkContext:  # noqa: N801 (Spark's own name)
        @staticmethod
        def setJobGroup(group: str, description: str, interruptOnCancel: bool) -> None:  # noqa: N802,N803
            pass

        @staticmethod
        def setLocalProperty(key: str, value: object) -> None:  # noqa: N802
            pass


@pytest.mark.parametrize("committed", [True, False])
def test_a_merge_stalled_after_its_commit_is_merged_and_one_stalled_before_fails(
    batches: KeyedBatches, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """Delta's checkpoint after a commit runs in the merge's thread, in its job group: when that
    job stalls and is cancelled, the state holds the batch and the run says so; a merge stalled
    before its commit fails the run (retryable), the state unchanged."""
    from airflow_pglogrepl.exceptions import MergeStalledError
    from airflow_pglogrepl.merge import materialize as module

    end = batches.inserts(range(1, 11))

    def stalled(spark: object, lake: Lake, name: str, at: LSN) -> LSN:
        if committed:
            arrow_merge.merge_table(lake, name, at)  # the commit lands ...
        raise MergeStalledError(name, 600)  # ... and a job after it is cancelled

    monkeypatch.setattr(module, "materialize_table", stalled)
    if committed:
        assert materialize(_StalledSpark(), batches.lake, small_rows=0) == {"public.t": str(end)}
    else:
        with pytest.raises(MergeStalledError):
            materialize(_StalledSpark(), batches.lake, small_rows=0)
        assert batches.lake.state_version(T) is None
