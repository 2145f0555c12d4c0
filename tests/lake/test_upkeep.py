"""Lake upkeep on real Delta tables: compaction keeps every row (deletion vectors written by Spark
included) and every position readable through the cut; a lost lock stops the upkeep before its
next commit; a table's failure leaves the others maintained. What VACUUM and log cleanup keep is
tests/lake/test_retention.py's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import WriterLockLostError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.cut import consistent_cut, read_cut
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.retention import Keep
from airflow_pglogrepl.lake.upkeep import WINDOWS, Thresholds, upkeep
from airflow_pglogrepl.lake.upkeep_report import upkeep_level
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef
from tests.support.upkeep import APP, SLOT, Built, files, ids, log_names, versions

A, B = "public.a", "public.b"
# No floor and no kept hours: what is kept is decided by the kept LSN alone.
BY_LSN = dict(hours=None, min_retention_hours=0.0)
EAGER = Thresholds(max_files=4, max_small_files=3, max_dv_files=1)


def test_compaction_packs_small_files_and_keeps_every_row_and_position(lake_uri: str) -> None:
    built = Built(lake_uri)
    for end in range(10, 130, 10):
        built.window(end, {A: [end, end + 1], B: [end]})
    built.state(A, 120, list(range(50)))
    built.state(B, 120, list(range(5)))
    paths, lake = built.paths, built.lake
    before = {uri: ids(uri) for uri in (paths.changes(A), paths.changes(B), paths.state(A))}
    position = lake.position()
    cut = consistent_cut(built.root, kind="changes", slot=SLOT)
    old = read_cut(cut)
    windows_files = files(paths.windows())

    report = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(60), **BY_LSN), thresholds=EAGER)

    by_name = {t.table: t for t in report.tables}
    assert set(by_name) == {f"changes/{A}", f"changes/{B}", f"state/{A}", f"state/{B}", WINDOWS}
    for name in (f"changes/{A}", f"changes/{B}"):
        assert by_name[name].compacted and by_name[name].files_before == 12
        assert by_name[name].files_after == 1
    assert not by_name[f"state/{A}"].compacted  # one file: below every threshold
    assert {uri: ids(uri) for uri in before} == before
    # the windows table: compacted, checkpointed at its version, the position unchanged
    assert files(paths.windows()) < windows_files and by_name[WINDOWS].compacted
    assert f"{versions(paths.windows()):020d}.checkpoint.parquet" in log_names(paths.windows())
    assert Lake(built.root, SLOT).position() == position == LSN(120)
    # a compaction commit carries no app transaction: it belongs to the one before it
    assert delta.txn_version(paths.changes(A), APP) == 120
    after = consistent_cut(built.root, kind="changes", slot=SLOT)
    assert after.position == cut.position and read_cut(after).keys() == old.keys()
    for name, table in read_cut(after).items():
        assert sorted(table.column("id").to_pylist()) == sorted(old[name].column("id").to_pylist())
    assert read_cut(consistent_cut(built.root, slot=SLOT))[A].num_rows == 50
    # idempotent: a second upkeep finds nothing to pack
    again = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(60), **BY_LSN), thresholds=EAGER)
    assert not any(t.compacted for t in again.tables)


def test_a_lost_lock_stops_the_upkeep_before_its_next_commit(tmp_path: Path) -> None:
    built = Built(tmp_path / "lake")
    for end in range(10, 80, 10):
        built.window(end, {A: [end], B: [end]})
    uris = [built.paths.changes(A), built.paths.changes(B), built.paths.windows()]
    before = {uri: (versions(uri), log_names(uri)) for uri in uris}
    checks: list[int] = []

    def check() -> None:
        checks.append(1)
        if len(checks) > 1:
            raise WriterLockLostError(SLOT, "its session is closed")

    with pytest.raises(WriterLockLostError):
        upkeep(built.root, SLOT, keep=Keep(lsn=LSN(70), **BY_LSN), thresholds=EAGER,
               writer_check=check)  # fmt: skip
    after = {uri: (versions(uri), log_names(uri)) for uri in uris}
    changed = [uri for uri in uris if after[uri] != before[uri]]
    assert changed == [built.paths.changes(A)]  # the one commit the lock was proven for
    assert versions(uris[0]) == before[uris[0]][0] + 1


@pytest.mark.spark
def test_a_state_with_sparks_deletion_vectors_is_compacted_row_for_row(
    tmp_path: Path, spark: Any
) -> None:
    from delta.tables import DeltaTable

    from airflow_pglogrepl.merge.materialize import TXN_APP_CONF, TXN_VERSION_CONF

    built = Built(tmp_path / "lake")
    built.window(10, {A: [1]})
    state = built.paths.state(A)
    session = spark.newSession()
    session.range(0, 1200).selectExpr("id", "cast(id as string) AS v").repartition(6).write.format(
        "delta"
    ).option("delta.enableDeletionVectors", "true").option("txnAppId", APP).option(
        "txnVersion", "10"
    ).save(state)
    for end, predicate in ((20, "id % 7 = 0"), (30, "id % 11 = 0")):
        built.window(end, {A: [end]})
        session.conf.set(TXN_APP_CONF, APP)
        session.conf.set(TXN_VERSION_CONF, str(end))
        DeltaTable.forPath(session, state).delete(predicate)
    session.conf.unset(TXN_APP_CONF)
    session.conf.unset(TXN_VERSION_CONF)

    def spark_rows(version: int | None = None) -> list[tuple[int, str]]:
        reader = session.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return sorted((r.id, r.v) for r in reader.load(state).collect())

    def rs_rows(version: int | None = None) -> list[tuple[int, str]]:
        rows = delta.read_table(state, version)
        return sorted(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))

    expected = [(i, str(i)) for i in range(1200) if i % 7 and i % 11]
    assert spark_rows() == rs_rows() == expected
    old = versions(state)

    report = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(30), **BY_LSN), thresholds=EAGER)

    table = {t.table: t for t in report.tables}[f"state/{A}"]
    assert table.compacted and table.dv_files_before >= 6 and table.dv_files_after == 0
    assert table.files_after == 1
    assert spark_rows() == rs_rows() == expected  # deleted rows stay deleted
    assert spark_rows(old) == rs_rows(old) == expected  # the kept version too
    assert delta.txn_version(state, APP) == 30
    cut = consistent_cut(built.root, slot=SLOT)
    assert cut.position == LSN(30) and read_cut(cut)[A].num_rows == len(expected)
    # Spark writes on after the upkeep's commits and checkpoint
    session.conf.set(TXN_APP_CONF, APP)
    session.conf.set(TXN_VERSION_CONF, "40")
    DeltaTable.forPath(session, state).delete("id = 1")
    session.conf.unset(TXN_APP_CONF)
    session.conf.unset(TXN_VERSION_CONF)
    assert rs_rows() == spark_rows() == expected[1:]


def test_a_log_is_checkpointed_once_then_every_checkpoint_every_versions(lake_uri: str) -> None:
    """A checkpoint every run was a file per table per run (about 9 a run in the soak)."""
    built = Built(lake_uri)
    for end in range(10, 40, 10):
        built.window(end, {A: [end]})
    uri = built.paths.changes(A)
    every = Thresholds(checkpoint_every=3)

    def report() -> Any:
        done = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(10), **BY_LSN), thresholds=every)
        return {t.table: t for t in done.tables}[f"changes/{A}"]

    first = report()  # no checkpoint yet: one now
    assert first.checkpoint == versions(uri) == 2
    assert f"{2:020d}.checkpoint.parquet" in log_names(uri)
    for end in (40, 50):
        built.window(end, {A: [end]})
    second = report()
    assert second.checkpoint == 2 and "checkpoint: 2 versions since the last one" in " ".join(
        second.skipped
    )
    assert f"{versions(uri):020d}.checkpoint.parquet" not in log_names(uri)
    built.window(60, {A: [60]})
    assert report().checkpoint == versions(uri) == 5


def test_a_table_that_needed_nothing_is_not_a_line_of_the_task_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line per table per run was 80 lines of "skipped" for a lake of 40 tables."""
    built = Built(tmp_path / "lake")
    built.window(10, {A: [10]})
    keep = Keep(lsn=LSN(10), **BY_LSN)
    upkeep(built.root, SLOT, keep=keep)  # the first run checkpoints every table
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.lake")
    caplog.clear()  # the first run's lines, when the suite's logging let them through
    again = upkeep(built.root, SLOT, keep=keep)
    assert again.tables and not [r for r in caplog.records if "upkeep of" in r.getMessage()]
    built.window(20, {A: [20]})
    for end in range(30, 230, 10):  # past max_small_files: compacted, and said so
        built.window(end, {A: [end]})
    caplog.clear()
    upkeep(built.root, SLOT, keep=keep)
    said = [r.getMessage() for r in caplog.records if "upkeep of" in r.getMessage()]
    assert any(f"upkeep of changes/{A}: " in m and "compacted" in m for m in said), said


def test_one_tables_failure_leaves_the_others_maintained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error names the table and its cause; the tables after it are still maintained."""
    from airflow_pglogrepl.exceptions import LakeError
    from airflow_pglogrepl.lake import upkeep as module

    built = Built(tmp_path / "lake")
    for end in range(10, 40, 10):
        built.window(end, {A: [end], B: [end]})
    real = module._maintain

    def failing(name: str, *args: Any) -> Any:
        if name == f"changes/{A}":
            raise OSError("no space left on device")
        return real(name, *args)

    monkeypatch.setattr(module, "_maintain", failing)
    with pytest.raises(
        LakeError,
        match=r"the upkeep of 1 of 3 tables .* failed, the others were "
        r"maintained: changes/public\.a \(OSError: no space left on device\)",
    ):
        upkeep(built.root, SLOT, keep=Keep(lsn=LSN(10), **BY_LSN))
    uri = built.paths.changes(B)  # maintained after the failure: checkpointed (it had none)
    assert f"{versions(uri):020d}.checkpoint.parquet" in log_names(uri)
    assert not any("checkpoint" in n for n in log_names(built.paths.changes(A)))


def _changes(names: list[str], rows: list[dict[str, Any]]) -> Any:
    """A full changelog batch (the table's columns, then the changelog's own)."""
    import pyarrow as pa

    from airflow_pglogrepl.changelog import columns as cl

    base = cl.mark_keys([pa.field(n, pa.int64() if i == 0 else pa.string())
                         for i, n in enumerate(names)], [names[0]])  # fmt: skip
    schema = pa.schema([*base, *cl.meta_fields(base)])
    width, n = len(names), len(rows)
    columns = [pa.array([r.get(c) for r in rows], f.type) for c, f in zip(names, base, strict=True)]
    columns += [pa.array(["I"] * n), pa.array([r["lsn"] for r in rows], pa.int64()),
                pa.array(range(n), pa.int64()), pa.array([1] * n, pa.int64()),
                pa.array([None] * n, pa.timestamp("us", tz="UTC")),
                pa.array([[]] * n, pa.list_(pa.string())),
                pa.nulls(n, schema.field(width + 6).type)]  # fmt: skip
    return pa.Table.from_arrays(columns, schema=schema)


def test_a_changelog_under_column_mapping_is_compacted_row_for_row(lake_uri: str) -> None:
    """delta-rs cannot compact a mapped table: the upkeep packs it itself, files from before
    the table was turned to column mapping (their own names) and after (physical names) alike,
    keeping every row, the app transaction and the commit LSN statistics."""
    from airflow_pglogrepl.lake.mapping import is_mapped

    lake = Lake(lake_uri, SLOT)
    ref = TableRef("public", "m")
    for i in range(8):
        names = ["id", "v"] if i < 4 else ["id", "v", "sp ace"]  # mapped in place at the fifth
        row = {"id": i, "v": f"v{i}", "sp ace": f"s{i}", "lsn": 100 * i + 50}
        window = Window(lake, LSN(100 * i))
        window.write(ref, _changes(names, [row]))
        window.commit(LSN(100 * i + 100), transactions=1, changes=1)
    uri = lake.paths.changes(ref)
    table = delta.open_table(uri)
    assert table is not None and is_mapped(table) and files(uri) == 8
    before = sorted(delta.read_table(uri).to_pylist(), key=lambda r: r["id"])

    report = upkeep(lake.root, SLOT, keep=Keep(lsn=LSN(100), **BY_LSN), thresholds=EAGER)

    done = {t.table: t for t in report.tables}[f"changes/{ref}"]
    assert done.compacted and files(uri) == 1, done
    assert sorted(delta.read_table(uri).to_pylist(), key=lambda r: r["id"]) == before
    assert [r["sp ace"] for r in before] == [None] * 4 + ["s4", "s5", "s6", "s7"]
    assert delta.txn_version(uri, APP) == 800
    table = delta.open_table(uri)
    assert table is not None
    stats = pa.table(table.get_add_actions(flatten=True)).to_pylist()[0]
    assert (stats["min._commit_lsn"], stats["max._commit_lsn"]) == (50, 750)
    again = upkeep(lake.root, SLOT, keep=Keep(lsn=LSN(100), **BY_LSN), thresholds=EAGER)
    assert not {t.table: t for t in again.tables}[f"changes/{ref}"].compacted


def test_a_mapped_state_keeps_its_files_with_deletion_vectors_out_of_a_compaction(
    tmp_path: Path, spark: Any
) -> None:
    """A file with a deletion vector cannot be removed by delta-rs (its remove would name no
    vector, and the file would stay live beside its packed copy): only the others are packed,
    and Spark and delta-rs read the same rows before and after."""
    from delta.tables import DeltaTable

    built = Built(tmp_path / "lake")
    built.window(10, {A: [1]})
    state = built.paths.state(A)
    session = spark.newSession()
    for part in range(6):  # one file each
        frame = session.range(part * 100, part * 100 + 100).selectExpr(
            "id", "concat('v', cast(id as string)) AS `sp ace`"
        )
        writer = frame.coalesce(1).write.format("delta").mode("append")
        if part == 0:
            writer = writer.options(**{"delta.enableDeletionVectors": "true",
                                       "delta.columnMapping.mode": "name",
                                       "delta.minReaderVersion": "3",
                                       "delta.minWriterVersion": "7"})  # fmt: skip
        writer.option("txnAppId", APP).option("txnVersion", str(part + 1)).save(state)
    DeltaTable.forPath(session, state).delete("id < 200 AND id % 3 = 0")  # two files' rows

    def rows() -> list[tuple[int, str]]:
        found = delta.read_table(state)
        return sorted(zip(found.column("id").to_pylist(), found.column("sp ace").to_pylist(),
                          strict=True))  # fmt: skip

    spark_before = sorted((r[0], r[1]) for r in session.read.format("delta").load(state).collect())
    before = rows()
    assert before == spark_before and len(before) == 600 - 67
    report = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(10), **BY_LSN), thresholds=EAGER)
    done = {t.table: t for t in report.tables}[f"state/{A}"]
    assert done.compacted and files(state) == 3, done  # 4 packed into 1, 2 left with vectors
    assert rows() == before
    assert sorted((r[0], r[1]) for r in session.read.format("delta").load(state).collect()) == (
        before
    )


def test_a_table_with_no_commit_since_its_upkeep_rests_until_it_moves(lake_uri: str) -> None:
    """Each run read every table's log: 7,300 requests a run for 40 tables on an object store
    with changes in 2 of them."""
    built = Built(lake_uri)
    for end in range(10, 40, 10):
        built.window(end, {A: [end], B: [end]})
    keep = Keep(lsn=LSN(30), **BY_LSN)

    def rested(thresholds: Thresholds | None = None) -> set[str]:
        done = upkeep(built.root, SLOT, keep=keep, thresholds=thresholds)
        resting = {t.table for t in done.tables
                   if t.skipped and t.skipped[0].startswith("upkeep: no commit since")}  # fmt: skip
        for table in done.tables:
            if table.table in resting:
                assert upkeep_level(table) == logging.DEBUG and not table.compacted
        return resting

    assert rested() == set()  # first upkeep: every table maintained
    assert rested() == {f"changes/{A}", f"changes/{B}", WINDOWS}
    built.window(40, {A: [40]})  # changes/A and the windows table move
    assert rested() == {f"changes/{B}"}
    assert rested(Thresholds(recheck_hours=0)) == set()  # time alone: maintained again


def test_a_table_the_kept_position_held_back_is_maintained_when_it_moves(
    tmp_path: Path,
) -> None:
    """Log cleanup refused for the kept position must be done once the position moves on,
    though the table did not move (tests/lake/test_retention.py has the cleanup itself)."""
    built = Built(tmp_path / "lake")
    for end in range(10, 40, 10):
        built.window(end, {A: [end]})
    upkeep(built.root, SLOT, keep=Keep(lsn=LSN(10), **BY_LSN))  # holds versions from 0 on
    again = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(30), **BY_LSN))
    table = {t.table: t for t in again.tables}[f"changes/{A}"]
    assert not table.skipped[0].startswith("upkeep: no commit since")


def test_a_known_table_whose_log_is_gone_is_skipped_and_the_others_maintained(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tables the record knows are listed without opening them: one whose log was removed
    since made every later upkeep fail before it maintained any table."""
    import shutil

    built = Built(tmp_path / "lake")
    for end in range(10, 40, 10):
        built.window(end, {A: [end], B: [end]})
    keep = Keep(lsn=LSN(30), **BY_LSN)
    upkeep(built.root, SLOT, keep=keep)
    shutil.rmtree(f"{built.paths.changes(B)}/_delta_log")
    built.window(40, {A: [40]})
    with caplog.at_level(logging.WARNING, "airflow_pglogrepl.lake"):
        done = upkeep(built.root, SLOT, keep=Keep(lsn=LSN(40), **BY_LSN))
    assert {t.table for t in done.tables} == {f"changes/{A}", WINDOWS}
    assert f"upkeep of changes/{B} skipped: no Delta table there any more" in caplog.text


def test_an_upkeep_noted_in_the_future_does_not_rest_the_table(tmp_path: Path) -> None:
    """A worker whose clock ran ahead noted its upkeep later than now: the table must not rest
    until then."""
    import json
    import os

    built = Built(tmp_path / "lake")
    built.window(10, {A: [10]})
    keep = Keep(lsn=LSN(10), **BY_LSN)
    upkeep(built.root, SLOT, keep=keep)
    record = os.path.join(built.root, "_pglogrepl", "versions.json")
    with open(record) as found:
        document = json.load(found)
    for entry in document["tables"].values():
        entry["upkeep_at"] += 30 * 86400
    with open(record, "w") as out:
        json.dump(document, out)
    done = upkeep(built.root, SLOT, keep=keep)
    assert not any(t.skipped and t.skipped[0].startswith("upkeep: no commit since")
                   for t in done.tables)  # fmt: skip


def test_a_history_is_maintained_and_goes_on_after_it(tmp_path: Path) -> None:
    """Each merge of a history rewrites the files holding the versions it ends: the upkeep
    removes the files no kept version reads, and the history goes on after its commits (which
    say no state version: the ones before them do)."""
    from airflow_pglogrepl.merge.history import merge_history
    from tests.merge.test_history import NAME, history, window

    lake = Lake(str(tmp_path / "lake"), "s")
    end = window(lake, 0x100, [{"_op": "I", "id": k, "v": 0} for k in range(1, 4)])
    merge_history(lake, [NAME])
    for value in range(1, 6):
        end = window(lake, int(end), [{"_op": "U", "id": 1 + value % 3, "v": value}])
        merge_history(lake, [NAME])
    before = history(lake)
    report = upkeep(str(tmp_path / "lake"), "s", keep=Keep(lsn=None, **BY_LSN), thresholds=EAGER)
    found = {t.table: t for t in report.tables}[f"history/{NAME}"]
    assert found.files_removed >= 5 and found.files_after == 1  # every MERGE rewrote the one
    assert history(lake) == before
    later = window(lake, int(end), [{"_op": "D", "id": 2}])
    assert merge_history(lake, [NAME]) == {NAME: str(later)}
    assert sorted(r[0] for r in history(lake) if r[-1]) == [1, 3]
