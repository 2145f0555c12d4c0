"""A big history's versions ended on Spark, in deletion vectors, under the same commit rules."""

from __future__ import annotations

import datetime
import itertools
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.columns import KEY_META
from airflow_pglogrepl.exceptions import LakeCommitConflictError, WriterLockLostError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import history_spark
from airflow_pglogrepl.merge.history import history_position, merge_history
from airflow_pglogrepl.merge.history_state import seen_state_version
from airflow_pglogrepl.tables import TableRef
from tests.support.history_lake import (
    NAME,
    T,
    changes_of,
    commit_windows,
    commits,
    history_rows,
)
from tests.support.history_model import model, ordered, random_changes


def stages(changes: list[dict[str, Any]], parts: int) -> list[list[dict[str, Any]]]:
    """``changes`` in ``parts`` runs' worth, cut between transactions."""
    lsns = sorted({c["_commit_lsn"] for c in changes})
    cuts = [lsns[len(lsns) * i // parts] for i in range(1, parts)]
    bounds = [0, *cuts, lsns[-1] + 1]
    return [[c for c in changes if low <= c["_commit_lsn"] < high]
            for low, high in itertools.pairwise(bounds)]  # fmt: skip


def spark_merges(lake: Lake) -> list[dict[str, Any]]:
    return [c for c in commits(lake) if c["operation"] == "MERGE" and "Spark" in
            str(c.get("engineInfo", ""))]  # fmt: skip


def test_a_keyed_history_on_spark_and_on_delta_rs_is_the_models(
    spark: Any, lake_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run on delta-rs, the next two on Spark (deletion vectors), the last on
    delta-rs again over the vectors; each run's history is the model's."""
    alternate(spark, lake_uri, monkeypatch, keyed=True, full=False)


@pytest.mark.parametrize("full", [True, False], ids=["full", "no_identity"])
def test_a_history_without_a_key_on_spark_and_on_delta_rs_is_the_models(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    """Copies matched by every column, or versions by their beginning (``<=>``: a version
    begun from the state has none)."""
    alternate(spark, str(tmp_path / "lake"), monkeypatch, keyed=False, full=full)


def alternate(spark: Any, root: str, monkeypatch: pytest.MonkeyPatch, *, keyed: bool,
              full: bool) -> None:  # fmt: skip
    rng = random.Random(5)
    changes = random_changes(rng, keyed=keyed, full=full, transactions=120)
    if not keyed and not full:
        changes = [c for c in changes if c["_op"] in ("I", "T")]
    lake = Lake(root, "s")
    start, done = 0x100, []
    for index, stage in enumerate(stages(changes, 4)):
        start = int(commit_windows(lake, stage, [], keyed=keyed, full=full, start=start)[-1])
        monkeypatch.setattr(history_spark, "SPARK_BYTES", 0 if index in (1, 2) else 1 << 40)
        merge_history(lake, [NAME], spark=lambda: spark)
        done += stage
        assert ordered(history_rows(lake)) == ordered(model(done, keyed=keyed, full=full))
        assert history_position(lake, NAME) == LSN(start)
    merged = spark_merges(lake)
    assert merged, [c["operation"] for c in commits(lake)]
    added = [int(c["operationMetrics"].get("numTargetDeletionVectorsAdded", 0)) for c in merged]
    assert any(added), merged
    table = delta.open_table(lake.paths.history(T))
    assert (
        seen_state_version(table, lake.paths.history(T)) == -1
    )  # (no state: every Spark commit said so too)


def test_a_spark_merge_commits_nothing_without_the_lock_or_at_another_position(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_pglogrepl.merge.history_changes import TableChanges
    from airflow_pglogrepl.merge.history_versions import versions

    rng = random.Random(2)
    first, second = stages(random_changes(rng, keyed=True, full=False, transactions=60), 2)
    lake = Lake(str(tmp_path / "lake"), "s")
    end = commit_windows(lake, first, [], keyed=True, full=False)[-1]
    merge_history(lake, [NAME])
    later = commit_windows(lake, second, [], keyed=True, full=False, start=int(end))[-1]
    monkeypatch.setattr(history_spark, "SPARK_BYTES", 0)
    before = delta.open_table(lake.paths.history(T)).version()

    def lost() -> None:
        raise WriterLockLostError("s", "the lock is gone")

    monkeypatch.setattr(lake, "check_writer", lost)
    with pytest.raises(WriterLockLostError):
        merge_history(lake, [NAME], spark=lambda: spark)
    assert delta.open_table(lake.paths.history(T)).version() == before
    monkeypatch.undo()
    table = TableChanges(delta.open_table(lake.paths.changes(T)))
    target = delta.open_table(lake.paths.history(T))
    made = versions(table.read(int(end), int(later)), table.columns, table.keys,
                    prior=lambda _: table.types.empty_table(), types=table.types)  # fmt: skip
    uri = lake.paths.history(T)
    with pytest.raises(LakeCommitConflictError):
        history_spark.merge_on_spark(spark.newSession(), lake, uri, target, 0x50, later, made,
                                     table.types, {"pglogrepl.state_version": "3"})  # fmt: skip
    assert delta.open_table(uri).version() == before
    history_spark.merge_on_spark(spark.newSession(), lake, uri, target, int(end), later, made,
                                 table.types, {"pglogrepl.state_version": "3"})  # fmt: skip
    assert history_position(lake, NAME) == later
    assert seen_state_version(delta.open_table(uri), uri) == 3
    # planned on a version another commit of the app moved on from: Spark's MERGE would run
    # on the newest table, so the position is checked again right before it
    from airflow_pglogrepl.merge import history_writes

    stale = delta.open_table(uri)
    history_writes.record(lake, uri, table.types, LSN(int(later) + 1), int(later), {})
    with pytest.raises(LakeCommitConflictError):
        history_spark.merge_on_spark(spark.newSession(), lake, uri, stale, int(later),
                                     LSN(int(later) + 2), made, table.types, {})  # fmt: skip
    assert history_position(lake, NAME) == LSN(int(later) + 1)


def test_hostile_column_names_merge_on_spark(spark: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    key, value = 'i`d "k', "v`al ue"
    table = [pa.field(key, pa.int64(), metadata={KEY_META: "0"}), pa.field(value, pa.string())]
    schema = changes_of(table)
    lake = Lake(str(tmp_path / "lake"), "s")

    def commit(start: int, rows: list[dict[str, Any]]) -> LSN:
        stamp = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        full = [{"_unchanged": [], "_old": None, "_seq": 0, "_commit_ts": stamp, **row,
                 "_commit_lsn": start + 0x10 * (i + 1)} for i, row in enumerate(rows)]  # fmt: skip
        window = Window(lake, LSN(start))
        window.write(T, pa.Table.from_pylist(full, schema=schema))
        end = LSN(start + 0x10 * (len(rows) + 1))
        window.commit(end, transactions=len(rows), changes=len(rows))
        return end

    end = commit(0x100, [{"_op": "I", key: 1, value: "a"}, {"_op": "I", key: 2, value: "b"}])
    merge_history(lake, [NAME])
    monkeypatch.setattr(history_spark, "SPARK_BYTES", 0)
    commit(int(end), [{"_op": "U", key: 1, value: "c"}, {"_op": "D", key: 2}])
    merge_history(lake, [NAME], spark=lambda: spark)
    assert spark_merges(lake)
    rows = delta.scan(lake.paths.history(TableRef("public", "t"))).to_pylist()
    got = sorted((r[key], r[value], r["_is_current"], r["_ended_by"]) for r in rows)
    assert got == [(1, "a", False, "update"), (1, "c", True, None), (2, "b", False, "delete")]


def test_copies_of_the_source_are_taken_on_spark_as_on_delta_rs(spark: Any, tmp_path: Path) -> None:
    """A copy at the history's own position (a MERGE that keeps the position: Spark would skip
    a transaction version it has, so delta-rs makes it), then one taken with later changes."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    from tests.support.history_model import change

    def copy(lake: Lake, rows: list[tuple[int, int]], at: int) -> None:
        table = pa.Table.from_pylist([{"id": i, "v": v, "big": None} for i, v in rows],
                                     schema=pa.schema([("id", pa.int64()), ("v", pa.int64()),
                                                       ("big", pa.string())]))  # fmt: skip
        commit = CommitProperties(app_transactions=[Transaction(lake.app, at)],
                                  custom_metadata={"userMetadata": delta.REWRITTEN})  # fmt: skip
        write_deltalake(lake.paths.state(T), table, mode="overwrite", commit_properties=commit)

    made = {}
    for engine in ("delta-rs", "spark"):
        lake = Lake(str(tmp_path / engine), "s")
        kw: dict[str, Any] = {"spark": lambda: spark, "spark_bytes": 0} if engine == "spark" else {}
        first = [change("I", 0x1010, 0, 1, 1), change("I", 0x1020, 0, 2, 2)]
        end = int(commit_windows(lake, first, [], keyed=True, full=False)[-1])
        merge_history(lake, [NAME], **kw)
        copy(lake, [(1, 100), (3, 100)], end)  # at the history's position
        assert merge_history(lake, [NAME], **kw) == {NAME: str(LSN(end))}
        later = int(commit_windows(lake, [change("U", end + 0x10, 0, 3, 300)], [], keyed=True,
                                   full=False, start=end)[-1])  # fmt: skip
        copy(lake, [(1, 100), (3, 300), (4, 4)], later)  # with a change before it
        assert merge_history(lake, [NAME], **kw) == {NAME: str(LSN(later))}
        uri = lake.paths.history(T)
        assert seen_state_version(delta.open_table(uri), uri) == 1  # (the state's second)
        made[engine] = ordered(history_rows(lake))
    assert made["spark"] == made["delta-rs"]
    current = [(r[0], r[1]) for r in made["spark"] if r[-2]]  # (id, v) of _is_current
    assert sorted(current) == [(1, 100), (3, 300), (4, 4)]


def test_versions_holding_infinity_dates_are_ended_on_spark_where_delta_rs_fails(
    spark: Any, tmp_path: Path
) -> None:
    """PostgreSQL's 'infinity' date is the storage's extreme value (``changelog.types``), whose
    statistics delta-rs' MERGE panics on ("NaiveDate + TimeDelta overflowed"): Spark merges
    that batch, and the history holds the versions every run would otherwise fail on."""
    table = [pa.field("id", pa.int64(), metadata={KEY_META: "0"}), pa.field("d", pa.date32())]
    schema = changes_of(table)
    lake = Lake(str(tmp_path / "lake"), "s")

    def commit(start: int, ops: list[str], ids: list[int], days: list[int]) -> LSN:
        n = len(ops)
        stamp = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        columns = {
            "id": pa.array(ids, pa.int64()), "d": pa.array(days, pa.int32()).cast(pa.date32()),
            "_op": pa.array(ops), "_seq": pa.array([0] * n, pa.int64()),
            "_commit_lsn": pa.array([start + 0x10 * (i + 1) for i in range(n)], pa.int64()),
            "_commit_ts": pa.array([stamp] * n, pa.timestamp("us", tz="UTC")),
            "_unchanged": pa.array([[]] * n, pa.list_(pa.string())),
            "_old": pa.nulls(n, schema.field("_old").type),
        }  # fmt: skip
        window = Window(lake, LSN(start))
        window.write(T, pa.table(columns, schema=schema))
        end = LSN(start + 0x10 * (n + 1))
        window.commit(end, transactions=n, changes=n)
        return end

    inf, minus = 2**31 - 1, -(2**31)
    end = commit(0x100, ["I", "I", "I"], [1, 2, 3], [inf, minus, 5])
    merge_history(lake, [NAME])
    later = commit(int(end), ["U", "U"], [1, 2], [5, inf])
    assert merge_history(lake, [NAME], spark=lambda: spark) == {NAME: str(later)}
    rows = delta.scan(lake.paths.history(T))
    got = sorted(zip(rows.column("id").to_pylist(), rows.column("d").cast(pa.int32()).to_pylist(),
                     rows.column("_is_current").to_pylist(), strict=True))  # fmt: skip
    assert got == [(1, 5, True), (1, inf, False), (2, minus, False), (2, inf, True), (3, 5, True)]
