"""The drain loop without a server: a fake source (the ``DrainSource`` protocol) replays encoded
pgoutput rows, the lake is a real Delta lake on local disk, and the slot moves only after a
window's commit. Also: the Spark applications' code paths import no Airflow."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import (
    ArrowPeekError,
    PublicationNotFoundError,
    SinkFromAnotherSourceError,
    SlotAheadOfSinkError,
    SlotInUseError,
    SlotLostError,
)
from airflow_pglogrepl.hooks.records import SlotInfo
from airflow_pglogrepl.lake.delta import read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.sensors.verdicts import drain_refusal
from airflow_pglogrepl.spark.drain import Drain
from airflow_pglogrepl.tables import TableRef
from tests.support.pgoutput_encoder import Session, relation

pytestmark = pytest.mark.unit

INT8, TEXT = 20, 25


class FakeSource:
    """A slot over a fixed list of peek rows; records every advance."""

    def __init__(self, rows: list[tuple[LSN, int | None, bytes]], confirmed: int, flush: int):
        self.rows = rows
        self.slot = SlotInfo(
            name="s", plugin="pgoutput", slot_type="logical", database="db", temporary=False,
            active=False, active_pid=None, restart_lsn=LSN(confirmed),
            confirmed_flush_lsn=LSN(confirmed), wal_status="reserved", safe_wal_size=None,
            two_phase=False, retained_bytes=0, current_lsn=LSN(flush), inactive_since=None,
        )  # fmt: skip
        self.flush = LSN(flush)
        self.advances: list[LSN] = []
        self.dropped_publications: set[str] = set()

    def get_slot(self, name: str, *, plugin: str | None = None) -> SlotInfo:
        return self.slot

    def advance_slot(self, name: str, upto: LSN | str) -> LSN:
        self.advances.append(LSN(upto))
        self.slot = dataclasses.replace(self.slot, confirmed_flush_lsn=LSN(upto))
        return LSN(upto)

    def flush_lsn(self) -> LSN:
        return self.flush

    def missing_publications(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if n in self.dropped_publications]

    def source_identity(self) -> dict[str, object]:
        return dict(self.identity)

    identity: dict[str, object] = {"system_identifier": "7", "timeline": 1, "database": "db"}

    def peek_changes(
        self, slot: str, *, upto_lsn: LSN | str | None, options: Mapping[str, str],
        batch_rows: int = 5000, upto_nchanges: int | None = None,
    ) -> Iterator[tuple[LSN, int | None, Any]]:  # fmt: skip
        start = self.slot.confirmed_flush_lsn
        assert start is not None and upto_lsn is not None
        yield from (r for r in self.rows if start <= r[0] < LSN(upto_lsn))

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]:
        import pyarrow as pa

        if self.arrow_fails:
            raise ArrowPeekError("ADBC is not here")
        rows = [r[2] for r in self.peek_changes(slot, upto_lsn=upto_lsn, options=options)]
        step = self.batch_messages
        for first in range(0, len(rows), step):  # small batches: transactions span them
            yield pa.array(rows[first : first + step], pa.binary())

    arrow_fails = False
    batch_messages = 2


def two_transactions() -> Session:
    session = Session(start=0x1000)
    items = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    session.add(items).begin(700, 0x1100).insert(16384, b"1", b"one").insert(16384, b"2", b"two")
    session.commit(0x1100, 0x1108)
    session.begin(701, 0x1200).insert(16384, b"3", b"three").commit(0x1200, 0x1208)
    return session


def test_a_drain_writes_the_lake_then_advances_the_slot(tmp_path: Path) -> None:
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1 << 20)
    result = drain.run(time.monotonic()).to_dict()
    assert result["changes"] == 3 and result["transactions"] == 2
    assert source.advances == [LSN(0x2000)] and lake.position() == LSN(0x2000)
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    assert sorted((r["id"], r["name"], r["_op"]) for r in rows) == [
        (1, "one", "I"), (2, "two", "I"), (3, "three", "I")
    ]  # fmt: skip


@pytest.mark.parametrize("arrow_fails", [False, True])
def test_both_decoding_paths_write_the_same_lake(tmp_path: Path, arrow_fails: bool) -> None:
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.arrow_fails = arrow_fails
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1 << 20)
    result = drain.run(time.monotonic()).to_dict()
    assert result["columnar_windows"] == (0 if arrow_fails else 1)
    assert result["changes"] == 3 and result["transactions"] == 2
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    assert sorted((r["id"], r["name"], r["_op"], r["_seq"]) for r in rows) == [
        (1, "one", "I", 0), (2, "two", "I", 1), (3, "three", "I", 0)
    ]  # fmt: skip


class CountingSource(FakeSource):
    peeks = 0

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]:
        self.peeks += 1
        yield from super().peek_arrow(slot, upto_lsn=upto_lsn, options=options)


def test_one_peek_serves_several_windows_cut_where_separate_peeks_would_end(
    tmp_path: Path,
) -> None:
    """Windows of 0x400 bytes from 0x1000, one peek for up to four: commits at 0x1100 and
    0x1200 (window 1), none in 0x1400-0x1800 (no empty window committed: it grows), 0x1900
    (window 2, ending at 0x1C00), 0x1D00 and 0x1E00 (the last, ending at the peek's end)."""
    session = Session(start=0x1000)
    items = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    session.add(items)
    for xid, (commit, key) in enumerate([(0x1100, 1), (0x1200, 2), (0x1900, 3), (0x1D00, 4),
                                         (0x1E00, 5)]):  # fmt: skip
        session.lsn = commit - 0x40
        session.begin(700 + xid, commit).insert(16384, str(key).encode(), b"v")
        session.commit(commit, commit + 8)
    source = CountingSource(session.rows, confirmed=0x1000, flush=0x1F00)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x400)
    result = drain.run(time.monotonic())
    assert source.peeks == 1
    assert [(int(w.start), int(w.end), w.transactions, w.changes) for w in result.windows] == [
        (0x1000, 0x1400, 2, 2), (0x1400, 0x1C00, 1, 1), (0x1C00, 0x1F00, 2, 2)
    ]  # fmt: skip
    assert source.advances == [LSN(0x1400), LSN(0x1C00), LSN(0x1F00)]
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    by_key = {r["id"]: r["_commit_lsn"] for r in rows}
    assert by_key == {1: 0x1100, 2: 0x1200, 3: 0x1900, 4: 0x1D00, 5: 0x1E00}
    assert [w["end_lsn"] for w in lake.windows()] == ["0/1400", "0/1C00", "0/1F00"]


def test_a_window_is_cut_after_every_table_of_a_batch_and_a_later_decline_loses_nothing(
    tmp_path: Path,
) -> None:
    """T1 (commit 0x1300) writes tables a and b; T2 (0x1600, past the first window's end 0x1400)
    writes a; all in one batch, whose pieces are a = [T1, T2] and b = [T1]. The first window
    must hold T1's rows of both tables before it commits. A logical message in the next batch
    makes the columnar path decline: the per-message path goes on from 0x1400, where T1 is
    already skipped, so a row of T1 left out of the first window would be lost."""
    # The Relations come first in the stream with LSNs past 0x1400, so that a peek from 0x1000
    # sees one description per table and the fake's peek from 0x1400 sees them too.
    session = Session(start=0x1401)
    table_a = relation(16384, "a", [("id", INT8, True), ("name", TEXT)])
    table_b = relation(16385, "b", [("id", INT8, True), ("name", TEXT)])
    session.add(table_a, table_b)
    session.lsn = 0x1000
    session.begin(700, 0x1300).insert(16384, b"1", b"t1").insert(16385, b"1", b"t1")
    session.commit(0x1300, 0x1308)
    session.lsn = 0x1500
    session.begin(701, 0x1600).insert(16384, b"2", b"t2").commit(0x1600, 0x1608)
    first_batch = len(session.rows)
    session.begin(702, 0x1780)
    session.raw(b"M\x01" + (0x1700).to_bytes(8, "big") + b"p\x00" + (1).to_bytes(4, "big") + b"x")
    session.insert(16384, b"3", b"t3").commit(0x1780, 0x1788)
    source = FakeSource(session.rows, confirmed=0x1000, flush=0x1800)
    source.batch_messages = first_batch
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x400)
    result = drain.run(time.monotonic())
    assert [(int(w.start), int(w.end), w.decoder, w.transactions) for w in result.windows] == [
        (0x1000, 0x1400, "columnar", 1), (0x1400, 0x1800, "reference", 2)
    ]  # fmt: skip
    for name, keys in (("a", [1, 2, 3]), ("b", [1])):
        rows = read_table(lake.paths.changes(TableRef("public", name))).to_pylist()
        assert sorted(r["id"] for r in rows) == keys, name


def test_a_slot_ahead_of_the_lake_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    lake.open_window(LSN(0x1000)).commit(LSN(0x1100), transactions=0, changes=0)
    source = FakeSource([], confirmed=0x1500, flush=0x2000)
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1024)
    with pytest.raises(SlotAheadOfSinkError, match="0/1500"):
        drain.run(time.monotonic())
    assert source.advances == [] and lake.position() == LSN(0x1100)


def test_a_lake_ahead_of_the_slot_moves_the_slot_up_first(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    lake.open_window(LSN(0x1000)).commit(LSN(0x1300), transactions=0, changes=0)
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1024)
    result = drain.run(time.monotonic()).to_dict()
    assert source.advances == [LSN(0x1300)] and result["changes"] == 0  # nothing drained twice


class DroppingSource(FakeSource):
    """PostgreSQL 18: the publication is dropped after the first advance, and a peek only
    warns, so every later window would come back empty."""

    def advance_slot(self, name: str, upto: LSN | str) -> LSN:
        end = super().advance_slot(name, upto)
        self.dropped_publications.add("p")
        self.rows = []
        return end


@pytest.mark.parametrize("arrow_fails", [False, True])
def test_a_dropped_publication_stops_the_drain_before_a_commit(
    tmp_path: Path, arrow_fails: bool
) -> None:
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.dropped_publications.add("p")
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180)
    with pytest.raises(PublicationNotFoundError, match=r"publication 'p' does not exist"):
        drain.run(time.monotonic())
    assert source.advances == [] and lake.position() is None

    source = DroppingSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.arrow_fails = arrow_fails
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180)
    with pytest.raises(PublicationNotFoundError, match=r"slot did not move"):
        drain.run(time.monotonic())
    assert source.advances == [LSN(0x1180)] and lake.position() == LSN(0x1180)


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
    with pytest.raises(SinkFromAnotherSourceError, match=r"system identifier 7.*identifier 8"):
        drain.run(time.monotonic())
    promoted = FakeSource([], confirmed=0x1000, flush=0x2000)
    promoted.identity = {**source.identity, "timeline": 2}
    drain = Drain(source=promoted, lake=lake, slot="s", publications=["p"], max_window_bytes=1024)
    with pytest.raises(SinkFromAnotherSourceError, match=r"timeline 1.*timeline 2"):
        drain.run(time.monotonic())
    assert other.advances == [] and promoted.advances == []
    assert lake.position() == position
    # a deliberate change (pg_upgrade keeps slots, gives a new system identifier): on request
    Drain(source=other, lake=lake, slot="s", publications=["p"], max_window_bytes=1024,
          accept_source_change=True).run(time.monotonic())  # fmt: skip
    assert other.advances[0] == position  # the slot moved up to the lake first
    assert lake.recorded_source() == other.identity  # and the new source is recorded


def test_a_windows_table_from_before_source_identities_takes_them(tmp_path: Path) -> None:
    import pyarrow as pa

    from airflow_pglogrepl.lake import delta
    from airflow_pglogrepl.lake.lake import windows_schema

    lake = Lake(str(tmp_path / "lake"), "s")
    old = pa.schema([f for f in windows_schema() if f.name != "source"])
    row = {"kind": "window", "slot": "s", "start_lsn": "0/1000", "end_lsn": "0/1100",
           "transactions": 0, "changes": 0, "tables": "{}", "committed_at": None,
           "writer": "old:1"}  # fmt: skip
    uri = lake.paths.windows()
    written = delta.write_file(uri, pa.Table.from_pylist([row], schema=old), prefix="old")
    delta.commit_files(uri, old, [written], app=lake.app, version=0x1100)
    assert lake.recorded_source() is None
    lake.source = {"system_identifier": "7", "timeline": 1, "database": "db"}
    lake.record(kind="window", start=LSN(0x1100), end=LSN(0x1200))
    assert lake.recorded_source() == lake.source and lake.position() == LSN(0x1200)


def test_drain_refusal_names_lost_before_in_use() -> None:
    slot = FakeSource([], confirmed=0x10, flush=0x10).slot
    assert drain_refusal(slot) is None
    lost = drain_refusal(dataclasses.replace(slot, wal_status="lost", active=True))
    assert isinstance(lost, SlotLostError) and "drop it" in str(lost)
    busy = drain_refusal(dataclasses.replace(slot, active=True, active_pid=42))
    assert isinstance(busy, SlotInUseError) and "42" in str(busy)


def test_the_spark_applications_import_no_airflow() -> None:
    code = (
        "import sys\n"
        "import airflow_pglogrepl.spark.drain_app, airflow_pglogrepl.spark.snapshot_app\n"
        "import airflow_pglogrepl.spark.drain, airflow_pglogrepl.spark.snapshot\n"
        "import airflow_pglogrepl.hooks.pg.source, airflow_pglogrepl.lake.materialize\n"
        "bad = [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')]\n"
        "assert not bad, bad[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
