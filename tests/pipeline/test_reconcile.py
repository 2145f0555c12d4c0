"""Before a drain reads: the lake's identity and position against the slot's (``reconcile``).
A fake source (the ``DrainSource`` protocol), a real Delta lake on local disk."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import (
    LakeFromAnotherSourceError,
    LakeOfAnotherSlotError,
    LakePastFailoverError,
    LakeSnapshotUnfinishedError,
    SlotAheadOfLakeError,
)
from airflow_pglogrepl.lake.delta import read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.drain import Drain
from tests.pipeline.test_drain import two_transactions
from tests.support.fake_source import FakeSource


def test_a_slot_ahead_of_the_lake_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    Window(lake, LSN(0x1000)).commit(LSN(0x1100), transactions=0, changes=0)
    source = FakeSource([], confirmed=0x1500, flush=0x2000)
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1024)
    with pytest.raises(SlotAheadOfLakeError, match="0/1500"):
        drain.run(time.monotonic())
    assert source.advances == [] and lake.position() == LSN(0x1100)


def test_a_lake_ahead_of_the_slot_moves_the_slot_up_first(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    Window(lake, LSN(0x1000)).commit(LSN(0x1300), transactions=0, changes=0)
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1024)
    result = drain.run(time.monotonic()).to_dict()
    assert source.advances == [LSN(0x1300)] and result["changes"] == 0  # nothing drained twice


def test_a_lake_from_another_server_or_timeline_moves_nothing(tmp_path: Path) -> None:
    """Before: a lake ahead of the slot moved the slot up to it, whichever server wrote it
    (a changed DSN, a restored cluster, a promoted standby's new timeline)."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1100)
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    position = lake.position()
    assert lake.recorded_source() == source.identity and position is not None

    other = FakeSource([], confirmed=0x1000, flush=0x2000)  # the lake is ahead of this slot
    other.identity = {**source.identity, "system_identifier": "8"}
    drain = Drain(source=other, lake=lake, slot="s", publications=["p"], max_window_bytes=1024)
    with pytest.raises(LakeFromAnotherSourceError, match=r"system identifier 7.*identifier 8"):
        drain.run(time.monotonic())
    promoted = FakeSource([], confirmed=0x1000, flush=0x2000)
    promoted.identity = {**source.identity, "timeline": 2}
    drain = Drain(source=promoted, lake=lake, slot="s", publications=["p"], max_window_bytes=1024)
    with pytest.raises(LakeFromAnotherSourceError, match=r"timeline 1.*timeline 2"):
        drain.run(time.monotonic())
    assert other.advances == [] and promoted.advances == []
    assert lake.position() == position
    # a deliberate change (pg_upgrade keeps slots, gives a new system identifier): on request
    Drain(source=other, lake=lake, slot="s", publications=["p"], max_window_bytes=1024,
          accept_source_change=True).run(time.monotonic())  # fmt: skip
    assert other.advances[0] == position  # the slot moved up to the lake first
    assert lake.recorded_source() == other.identity  # and the new source is recorded


def test_a_promoted_standby_that_had_all_the_lake_holds_is_drained_on_unasked(
    tmp_path: Path,
) -> None:
    """The same server on a later timeline, which left the lake's at or after its position: a
    failover slot synchronized to the standby, behind the lake, is moved up to it. Before, the
    run was refused as another source unless ``accept_source_change`` was given."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    assert lake.position() == LSN(0x1300)
    promoted = FakeSource([], confirmed=0x1100, flush=0x2000)  # the synced slot, behind
    promoted.identity = {**source.identity, "timeline": 2}
    promoted.switches = {1: LSN(0x1300)}
    result = Drain(source=promoted, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    assert promoted.advances[0] == LSN(0x1300) and result.to_dict()["changes"] == 0
    assert lake.recorded_source() == promoted.identity and lake.position() == LSN(0x2000)


def test_a_promoted_standby_that_missed_part_of_the_lake_moves_nothing(tmp_path: Path) -> None:
    """The old primary let the drain confirm WAL its standby never received (no
    ``synchronized_standby_slots``): the new primary's commits take those LSNs."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    for slot_at in (0x1100, 0x1300, 0x1400):  # behind the lake, at it, and past it
        promoted = FakeSource([], confirmed=slot_at, flush=0x2000)
        promoted.identity = {**source.identity, "timeline": 3}
        promoted.switches = {1: LSN(0x1200), 2: LSN(0x1800)}
        drain = Drain(source=promoted, lake=lake, slot="s", publications=["p"],
                      max_window_bytes=1024)  # fmt: skip
        with pytest.raises(
            LakePastFailoverError, match=r"holds the WAL up to 0/1300 on timeline 1.*at 0/1200"
        ):
            drain.run(time.monotonic())
        assert promoted.advances == [] and lake.position() == LSN(0x1300)


def test_another_branch_of_the_history_is_refused_with_the_slot_at_the_lake(
    tmp_path: Path,
) -> None:
    """A timeline of the same system that did not come from the lake's (a sibling promotion, a
    server restored from an old backup). Before, only a lake ahead of the slot was refused: a
    slot at the lake went on, with LSNs of another history."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    for timeline, switches in ((2, {}), (2, {3: LSN(0x1400)})):
        sibling = FakeSource([], confirmed=0x1300, flush=0x2000)
        sibling.identity = {**source.identity, "timeline": timeline}
        sibling.switches = switches
        with pytest.raises(LakeFromAnotherSourceError, match=r"another branch"):
            Drain(source=sibling, lake=lake, slot="s", publications=["p"],
                  max_window_bytes=1024).run(time.monotonic())  # fmt: skip
        assert sibling.advances == [] and lake.position() == LSN(0x1300)


def test_a_table_committed_past_the_switch_point_moves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed between a table's commit and the window's commit point leaves the table
    past the lake's position, and the drain skips its rows below that. Before, a promotion
    between the two went on: the new primary's own commits there were skipped, and the old
    timeline's rows, which never happened on it, stayed."""
    from tests.support.pgoutput_encoder import (
        T0,
        BeginMessage,
        CommitMessage,
        InsertMessage,
        encode,
        relation,
    )  # fmt: skip

    def txn(xid: int, begin: int, commit: int, key: bytes) -> list[tuple[LSN, int, bytes]]:
        items = relation(16384, "items", [("id", 20, True), ("name", 25)])
        return [(LSN(begin), xid, encode(BeginMessage(LSN(commit), T0, xid))),
                (LSN(begin + 1), xid, encode(items)),
                (LSN(begin + 2), xid, encode(InsertMessage(None, 16384, (key, b"v")))),
                (LSN(commit + 8), xid,
                 encode(CommitMessage(0, LSN(commit), LSN(commit + 8), T0)))]  # fmt: skip

    lake = Lake(str(tmp_path / "lake"), "s")
    old = FakeSource(txn(700, 0x1020, 0x1100, b"1") + txn(701, 0x1200, 0x1280, b"2"),
                     confirmed=0x1000, flush=0x1150)  # fmt: skip
    Drain(source=old, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1 << 20).run(time.monotonic())  # fmt: skip
    old.flush = LSN(0x1300)
    record = Lake.record

    def killed(self: Lake, **kwargs: Any) -> None:
        if kwargs.get("kind") == "window":
            raise SystemExit("killed before the window's commit point")
        record(self, **kwargs)

    monkeypatch.setattr(Lake, "record", killed)
    with pytest.raises(SystemExit):
        Drain(source=old, lake=Lake(lake.root, "s"), slot="s", publications=["p"],
              max_window_bytes=1 << 20).run(time.monotonic())  # fmt: skip
    monkeypatch.setattr(Lake, "record", record)
    lake = Lake(lake.root, "s")
    assert lake.position() == LSN(0x1150) and lake.covered("public.items") == LSN(0x1300)
    promoted = FakeSource([], confirmed=0x1100, flush=0x2000)
    promoted.identity = {**old.identity, "timeline": 2}
    promoted.switches = {1: LSN(0x1180)}  # the standby had the first commit, not the second
    drain = Drain(source=promoted, lake=lake, slot="s", publications=["p"],
                  max_window_bytes=1 << 20)  # fmt: skip
    with pytest.raises(LakePastFailoverError, match=r"table public.items .* up to 0/1300"):
        drain.run(time.monotonic())
    assert promoted.advances == [] and lake.position() == LSN(0x1150)


def test_a_windows_table_from_before_source_identities_takes_them(tmp_path: Path) -> None:
    import pyarrow as pa

    from airflow_pglogrepl.lake import delta
    from airflow_pglogrepl.lake.windows_table import windows_schema

    lake = Lake(str(tmp_path / "lake"), "s")
    old = pa.schema([f for f in windows_schema() if f.name != "source"])
    row = {"kind": "window", "slot": "s", "start_lsn": "0/1000", "end_lsn": "0/1100",
           "transactions": 0, "changes": 0, "tables": "{}", "committed_at": None,
           "writer": "old:1"}  # fmt: skip
    uri = lake.paths.windows()
    written = delta.write_file(uri, pa.Table.from_pylist([row], schema=old), prefix="old")
    delta.commit_files(uri, old, [written], app=lake.app, version=0x1100, expected=None)
    assert lake.recorded_source() is None
    lake.source = {"system_identifier": "7", "timeline": 1, "database": "db"}
    lake.record(kind="window", start=LSN(0x1100), end=LSN(0x1200))
    assert lake.recorded_source() == lake.source and lake.position() == LSN(0x1200)


def test_a_lake_of_another_slot_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Before: a drain under a new slot name started at its slot, and its first merge replayed
    the other slot's whole changelog onto the state."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    rows = read_table(lake.paths.windows()).num_rows
    other = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    with pytest.raises(LakeOfAnotherSlotError, match=r"belongs to slot 's'.*not to slot 'x'"):
        Drain(source=other, lake=Lake(lake.root, "x"), slot="x", publications=["p"],
              max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    assert other.advances == [] and read_table(lake.paths.windows()).num_rows == rows
    assert lake.identity() == {
        **(lake.identity() or {}),
        "slot": "s", "system_identifier": "7", "database": "db", "publications": ["p"],
        "began_with": "drain",
    }  # fmt: skip


def test_a_drain_refuses_a_lake_whose_initial_snapshot_never_committed(tmp_path: Path) -> None:
    """Before: a killed snapshot left its slot; a plain drain then started at the slot, and the
    tables the snapshot never reached were left empty without an error."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    lake.claim(source.identity, publications=["p"], began_with="snapshot")  # then killed
    with pytest.raises(LakeSnapshotUnfinishedError, match=r"initial snapshot of slot 's'"):
        Drain(source=source, lake=lake, slot="s", publications=["p"],
              max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    assert source.advances == [] and lake.position() is None and lake.changes_tables() == []


def _relation(oid: int, created: int, name: str = "items") -> Any:
    from airflow_pglogrepl.postgres.coverage import PublishedRelation
    from airflow_pglogrepl.tables import TableRef

    return PublishedRelation(oid=oid, table=TableRef("public", name), created=created,
                             created_raw=created, published=None, membership=(created + 1,),
                             linked_then=True, leaves={})  # fmt: skip


IDENTITY = {"system_identifier": "7", "timeline": 1, "database": "db", "database_oid": 16384,
            "server_version_num": 170011}  # fmt: skip


@pytest.mark.parametrize(
    ("before", "change", "relation", "refused_for"),
    [
        ({}, {"server_version_num": 180001}, (16400, "items"), None),  # pg_upgrade
        ({}, {"server_version_num": 170012}, (16400, "items"), "not a later major"),
        ({"server_version_num": 160009}, {"server_version_num": 170002}, (16400, "items"),
         "keeps logical slots only from 17"),
        ({"server_version_num": None}, {"server_version_num": 180001}, (16400, "items"),
         "no server version"),
        ({}, {"server_version_num": 180001, "database_oid": 16390}, (16400, "items"),
         "database_oid"),
        ({}, {"server_version_num": 180001}, (16999, "items"), "not published there"),
        ({}, {"server_version_num": 180001}, (16400, "other"), "not published there"),
    ],
)  # fmt: skip
def test_a_slot_ahead_after_pg_upgrade_is_drained_from_when_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, before: dict[str, object],
    change: dict[str, object], relation: tuple[int, str], refused_for: str | None,
) -> None:  # fmt: skip
    """``pg_upgrade`` creates the slot again at the new cluster's position, past the lake's;
    with ``accept_source_change`` the run goes on from there when everything an upgrade keeps
    is there: a later major from 17, the database, every relation's OID and name. Before, the
    run was refused as a slot consumed by someone else, whatever was asked; then a server of a
    later major with the same database OID (5 for ``postgres`` in every cluster) was enough."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    source.identity = {**IDENTITY, **before}
    source.relations = [_relation(16400, 700)]
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    upgraded = FakeSource([], confirmed=0x8000, flush=0x8000)
    upgraded.identity = {**IDENTITY, "system_identifier": "9", **change}
    upgraded.relations = [_relation(relation[0], 9100, relation[1])]  # (restored anew)
    drain = Drain(source=upgraded, lake=lake, slot="s", publications=["p"], max_window_bytes=1024,
                  accept_source_change=True)  # fmt: skip
    if refused_for is None:
        assert drain.run(time.monotonic()).incomplete == {}
        assert upgraded.advances == [] and lake.position() == LSN(0x8000)
        assert lake.recorded_source() == upgraded.identity  # so the next run needs no asking
        again = Drain(source=upgraded, lake=lake, slot="s", publications=["p"],
                      max_window_bytes=1024).run(time.monotonic())  # fmt: skip
        assert again.incomplete == {}  # the record carried over: nothing "removed" or "added"
    else:
        with pytest.raises(SlotAheadOfLakeError):
            drain.run(time.monotonic())
        assert lake.position() == LSN(0x1300)
        assert refused_for in caplog.text
