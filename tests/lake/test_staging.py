"""A table's snapshot staged out of readers' sight, then published whole (``lake.staging``): a
staged copy is no table until published, is published once (put-if-absent) and only as a plain
first write, and names the consistent point it was taken at; what killed snapshots left is
found (a staged copy in a folder without a table, a published table carrying the slot's
transaction) and nothing else (another writer's table, copies inside a table)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_pglogrepl.exceptions import LakeError, SnapshotTableExistsError
from airflow_pglogrepl.lake import staging
from airflow_pglogrepl.lake.delta import list_tables, read_table
from airflow_pglogrepl.lsn import LSN

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})


def test_a_staged_copy_is_no_table_until_published_whole_and_once(tmp_path: Path) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    state, app, point = str(tmp_path / "state"), "airflow-pglogrepl/s", LSN("0/3000060")
    table = f"{state}/public.t"
    staged = staging.staged_uri(table, point)
    commit = CommitProperties(app_transactions=[Transaction(app, int(point))])
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    write_deltalake(staged, rows, commit_properties=commit,
                    configuration={"delta.enableDeletionVectors": "true"})  # fmt: skip
    assert staged == f"{table}/snapshot-0000000003000060"
    assert list_tables(state) == []  # a folder without a log: no table
    assert staging.staged_points(state) == [point]
    assert staging.leftovers(state, app) == [staged]
    written = DeltaTable(staged)

    assert staging.publish(table, staged) == 1
    published = DeltaTable(table)
    assert published.version() == 0 and published.transaction_version(app) == int(point)
    assert published.protocol() == written.protocol()  # the writer's own commit, moved
    assert published.metadata().configuration == {"delta.enableDeletionVectors": "true"}
    assert read_table(table).column("id").to_pylist() == [1, 2, 3]
    assert not os.path.exists(f"{staged}/_delta_log") and os.path.isdir(staged)
    assert [p for p in os.listdir(f"{table}/_delta_log") if not p.endswith(".json")] == []
    # a published table is a killed run's only if it is this slot's; its files are never loose
    assert staging.leftovers(state, app) == [table]
    assert staging.leftovers(state, "airflow-pglogrepl/other") == []

    again = staging.staged_uri(table, LSN("0/4000000"))
    write_deltalake(again, rows)
    with pytest.raises(SnapshotTableExistsError, match=r"a Delta table is there already"):
        staging.publish(table, again)  # put-if-absent: the table stays as it was
    assert read_table(table).column("id").to_pylist() == [1, 2, 3]
    write_deltalake(again, rows, mode="append")
    with pytest.raises(LakeError, match=r"not one first write"):
        staging.publish(f"{state}/public.u", again)
    assert list_tables(state) == ["public.t"]


@pytest.mark.parametrize(
    ("name", "point"),
    [("snapshot-0000000003000060", LSN("0/3000060")),
     ("snapshot-FFFFFFFFFFFFFFFF", LSN(2**64 - 1)),
     ("snapshot-0000000003000060x", None), ("snapshot-3000060", None),
     ("snapshot-00000000030000ab", None),  # staged_uri writes upper case only
     ("_delta_log", None), ("part-00000.parquet", None)],
)  # fmt: skip
def test_a_staged_directorys_name_carries_its_consistent_point(
    name: str, point: LSN | None
) -> None:
    assert staging.staged_point(name) == point
    if point is not None:
        assert staging.staged_uri("/l/state/public.t", point) == f"/l/state/public.t/{name}"


def test_the_points_of_every_staged_copy_are_sorted_and_each_given_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert staging.staged_points(str(state)) == []  # no state/ yet
    for table, point in (("public.a", "0/5000000"), ("public.b", "0/3000000"),
                         ("public.b", "0/5000000")):  # fmt: skip
        os.makedirs(staging.staged_uri(str(state / table), LSN(point)))
    os.makedirs(state / "public.b" / "not-a-copy")
    assert staging.staged_points(str(state)) == [LSN("0/3000000"), LSN("0/5000000")]


def test_only_what_the_slots_killed_snapshots_left_is_a_leftover(tmp_path: Path) -> None:
    state, app = str(tmp_path / "state"), "airflow-pglogrepl/s"
    loose = staging.staged_uri(f"{state}/public.a", LSN("0/3000000"))
    os.makedirs(loose)  # killed while copying: a folder with no table
    theirs = f"{state}/public.b"
    write_deltalake(theirs, ROWS)  # a table without the slot's transaction: another writer's
    inside = staging.staged_uri(theirs, LSN("0/3000000"))
    os.makedirs(inside)  # inside a table: its log may name the files
    assert staging.leftovers(state, app) == [loose]
    assert staging.leftovers(str(tmp_path / "nowhere"), app) == []


@pytest.mark.parametrize("action", ["remove", "cdc", "deletionVector"])
def test_a_staged_copy_that_is_not_a_plain_first_write_is_not_published(
    tmp_path: Path, action: str
) -> None:
    """A removed file, a change data file or a deletion vector (whose path Delta derives from
    the table root) would not survive the move under the staged directory."""
    table = str(tmp_path / "state" / "public.t")
    staged = staging.staged_uri(table, LSN("0/3000000"))
    write_deltalake(staged, ROWS)
    log = Path(staged, "_delta_log", staging.FIRST_COMMIT)
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    if action == "deletionVector":
        added = next(a for a in actions if "add" in a)
        added["add"]["deletionVector"] = {"storageType": "u", "pathOrInlineDv": "x",
                                          "sizeInBytes": 1, "cardinality": 1}  # fmt: skip
    else:
        actions.append({action: {"path": "part-x.parquet", "dataChange": True}})
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    with pytest.raises(LakeError, match=r"is not a plain first write \((add|remove|cdc) action\)"
                       r".*Nothing was published; take the snapshot again"):  # fmt: skip
        staging.publish(table, staged)
    assert not Path(table, "_delta_log").exists() and log.exists()


def test_a_staged_copy_without_its_log_is_not_published(tmp_path: Path) -> None:
    table = str(tmp_path / "state" / "public.t")
    staged = staging.staged_uri(table, LSN("0/3000000"))
    os.makedirs(staged)
    with pytest.raises(LakeError, match=r"holds versions \[\], not one first write"):
        staging.publish(table, staged)


def test_remove_takes_a_directory_whole_and_a_missing_one_is_no_error(tmp_path: Path) -> None:
    staged = tmp_path / "state" / "public.t" / "snapshot-0000000003000000"
    (staged / "_delta_log").mkdir(parents=True)
    (staged / "part-0.parquet").write_bytes(b"x")
    staging.remove(str(staged))
    assert not staged.exists() and staged.parent.is_dir()
    staging.remove(str(staged))  # gone already
