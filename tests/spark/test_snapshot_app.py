"""The snapshot application's command line and its modes, without a JVM: what argparse refuses
(a handed snapshot without its consistent point, ``--replace-slot`` outside a standalone
snapshot, no publication unless resolving), the exported snapshot's name taken from the
environment, ``--resolve`` reading where a lake stands without Spark, and a handed snapshot
refused when the slot is not at its consistent point."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake import staging, storage
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.source import PgSource
from airflow_pglogrepl.spark import snapshot_app
from airflow_pglogrepl.spark.snapshot_app import SNAPSHOT_ENV, parse_args
from tests.support.sources import Source

BASE = ["--slot", "s", "--publication", "p", "--lake", "/l"]


def test_the_defaults_and_every_setting() -> None:
    args = parse_args(BASE)
    assert (args.slot, args.publication, args.lake_root) == ("s", ["p"], "/l")
    assert args.tasks_per_table is None and args.rows_per_task == 1_000_000
    assert (args.parallelism, args.lock_timeout) == (4, 60.0)
    assert args.snapshot_name is None and args.consistent_point is None and args.table is None
    assert not args.replace_slot and not args.resolve and args.state_deletion_vectors is None
    args = parse_args([
        *BASE, "--publication", "q", "--tasks-per-table", "8", "--rows-per-task", "5000",
        "--parallelism", "2", "--lock-timeout", "1.5", "--table", "public.a", "--table", "s.b",
        "--state-deletion-vectors",
    ])  # fmt: skip
    assert args.publication == ["p", "q"] and args.table == ["public.a", "s.b"]
    assert (args.tasks_per_table, args.rows_per_task, args.parallelism) == (8, 5000, 2)
    assert args.lock_timeout == 1.5 and args.state_deletion_vectors is True


def test_the_snapshots_name_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The name of an exported snapshot is a handle on the exporting session: kept off argv."""
    monkeypatch.setenv(SNAPSHOT_ENV, "00000003-00000002-1")
    args = parse_args([*BASE, "--consistent-point", "0/1"])
    assert args.snapshot_name == "00000003-00000002-1"
    given = parse_args([*BASE, "--snapshot-name", "given", "--consistent-point", "0/1"])
    assert given.snapshot_name == "given"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--slot", "s", "--lake", "/l"], "--publication is required"),
        ([*BASE, "--snapshot-name", "n"], "--snapshot-name and --consistent-point go together"),
        ([*BASE, "--consistent-point", "0/1"], "--snapshot-name and --consistent-point go"),
        ([*BASE, "--replace-slot", "--table", "public.t"],
         "--replace-slot only applies to a standalone initial snapshot"),
        ([*BASE, "--replace-slot", "--snapshot-name", "n", "--consistent-point", "0/1"],
         "--replace-slot only applies"),
        (["--publication", "p", "--lake", "/l"], "required: --slot"),
    ],
)  # fmt: skip
def test_a_wrong_command_line_is_refused_naming_why(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SNAPSHOT_ENV, raising=False)
    with pytest.raises(SystemExit) as refused:
        parse_args(argv)
    assert refused.value.code == 2 and said in capsys.readouterr().err


def test_resolving_needs_no_publication_and_reads_a_lake_without_spark(tmp_path: Path) -> None:
    """``--resolve`` is how the operator reads a lake after a failed job: what a killed run
    staged is reported, nothing is written, and no Spark session is started."""
    from deltalake import write_deltalake

    root = str(tmp_path / "lake")
    point = LSN("0/3000060")
    write_deltalake(staging.staged_uri(f"{root}/state/public.t", point),
                    pa.table({"id": pa.array([1], pa.int64())}))  # fmt: skip
    args = parse_args(
        ["--slot", "s", "--lake", root, "--resolve", "--consistent-point", str(point)]
    )
    assert args.publication == []
    with storage.using(None):
        status = snapshot_app.run(args, "host=/nonexistent dbname=x", 0.0)
    assert status == {"resolved": True, "commits": 0, "snapshot_lsn": None,
                      "uncommitted_snapshots": [str(point)], "committed": False}  # fmt: skip
    assert Lake(root, "s").position() is None


def test_a_handed_snapshot_is_refused_when_the_slot_is_elsewhere(source: Source) -> None:
    """A handed snapshot must be the slot's own: one exported at another point (another slot's,
    or this one consumed since) would hand the drain a gap or a repeat."""
    (confirmed,) = source.sql(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (source.slot,),
    )[0]
    elsewhere = LSN(confirmed) + 8
    args = parse_args(["--slot", source.slot, "--publication", "p", "--lake", "/nowhere",
                       "--snapshot-name", "n", "--consistent-point", str(elsewhere)])  # fmt: skip

    def no_spark() -> None:
        raise AssertionError("Spark was asked for")

    lake = Lake("/nowhere", source.slot)
    with pytest.raises(ValueError, match=rf"slot '{source.slot}' is at {confirmed}, not at the "
                       rf"consistent point {elsewhere} the snapshot was exported at"):  # fmt: skip
        snapshot_app._handed(args, PgSource(source.dsn), lake, no_spark)
