"""Which reader a run with ``reader="auto"`` uses (``reader_choice``): the rule alone; a drain
over a fake whose slot is pinned, then moves on to the stream; live, a backlog read with peeks
and one behind a transaction left open read with the stream, each saying why."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import SlotStreamError
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.delta import read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.pipeline.reader_choice import STREAM_COST, peek_or_stream
from airflow_pglogrepl.tables import TableRef
from tests.pipeline.test_stream_phase import _PeeksAsAServer
from tests.pipeline.test_windows import ITEMS, _ids, three_transactions
from tests.support.drain import changelog
from tests.support.fake_source import FakeSource, ServerStream
from tests.support.pgoutput_encoder import Session, relation
from tests.support.sources import Source
from tests.support.wal import FILLER, restart_lsn_pinned

MIB = 1 << 20
INT8, TEXT = 20, 25


def test_a_backlog_is_peeked_and_a_pin_that_each_peek_would_decode_again_is_streamed() -> None:
    span = 256 * MIB  # four 64 MiB windows a peek
    assert peek_or_stream(pinned=0, remaining=1024 * MIB, span=span).reader == "peek"
    assert peek_or_stream(pinned=64 * MIB, remaining=1024 * MIB, span=span).reader == "peek"
    pinned = peek_or_stream(pinned=600 * MIB, remaining=1024 * MIB, span=span)
    assert pinned.reader == "stream" and "600.0 MiB behind" in pinned.why
    # one peek left: the stream would decode the pin once too, and send every message
    assert peek_or_stream(pinned=4096 * MIB, remaining=200 * MIB, span=span).reader == "peek"


def test_the_crossing_is_where_the_decodes_again_cost_what_the_stream_adds() -> None:
    span, remaining = 100, 1000  # ten peeks: nine decode the pin again
    crossing = STREAM_COST * remaining / 9
    assert peek_or_stream(pinned=int(crossing), remaining=remaining, span=span).reader == "peek"
    assert (
        peek_or_stream(pinned=int(crossing) + 1, remaining=remaining, span=span).reader == "stream"
    )
    with pytest.raises(ValueError, match="span"):
        peek_or_stream(pinned=0, remaining=1, span=0)


def _transactions(count: int) -> Session:
    """One single-row transaction committing every 0x100 from 0x1100, its messages just
    before its commit, as a server's WAL has them."""
    session = Session(start=0x1000)
    session.add(relation(16384, "items", [("id", INT8, True), ("name", TEXT)]))
    for n in range(count):
        at = 0x1100 + 0x100 * n
        session.lsn = at - 0x30
        session.begin(700 + n, at).insert(16384, str(n + 1).encode(), b"x")
        session.lsn = at - 0x10
        session.commit(at, at + 8)
    return session


class _EndsEarly(ServerStream):
    """A walsender that goes away before its seventh batch; its confirms never arrived."""

    def batches(self) -> Any:
        for n, batch in enumerate(super().batches()):
            if n == 6:
                raise SlotStreamError("s", "h:1", "the connection was lost")
            yield batch

    def close(self) -> bool:
        return False


def _pinned(stream: type[ServerStream] = ServerStream) -> FakeSource:
    """30 transactions to 0/2E00 (flush 0/3000) behind a transaction left open at 0/1000: the
    slot's restart_lsn stays there while the run moves the slot."""
    source = _PeeksAsAServer(_transactions(30).rows, confirmed=0x1000, flush=0x3000,
                             restart=0x1000)  # fmt: skip
    source.streams = True
    source.stream_slot = lambda slot, *, start, options, alive=None: stream(  # type: ignore[method-assign]
        source, start, dict(options))  # fmt: skip
    return source


def _ids_of(lake: Lake) -> list[int]:
    if not Path(lake.paths.changes(ITEMS)).exists():  # (no window held a commit yet)
        return []
    return sorted(r["id"] for r in read_table(lake.paths.changes(ITEMS)).to_pylist())


def test_a_run_whose_pin_grows_moves_on_to_the_stream_and_lands_every_row_once(
    tmp_path: Path,
) -> None:
    """restart_lsn stays while the run's peeks move the slot, so each peek would decode more
    again, until the stream pays: it opens where the peeks ended and sends the rest."""
    source = _pinned()
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x100).run(time.monotonic())  # fmt: skip
    assert result.reader == "stream" and result.reader_note is not None
    assert "restart_lsn is" in result.reader_note and "behind" in result.reader_note
    (stream,) = source.streamed
    assert source.advances and source.advances[-1] == stream.start > LSN(0x1000)
    streamed = [w for w in result.windows if w.start >= stream.start]
    assert sum(w.transactions for w in streamed) > 0  # the stream carried rows, not only WAL
    assert _ids_of(lake) == list(range(1, 31)) and lake.position() == LSN(0x3000)


def test_a_stream_that_ends_early_after_peeks_hands_back_to_them_and_loses_nothing(
    tmp_path: Path,
) -> None:
    source = _pinned(_EndsEarly)
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x100).run(time.monotonic())  # fmt: skip
    assert result.reader == "stream" and "ended early" in (result.reader_note or "")
    assert _ids_of(lake) == list(range(1, 31)) and lake.position() == LSN(0x3000)


@pytest.mark.parametrize("max_windows", [1, 2, 4, 9, 12])
def test_a_run_that_may_move_on_to_the_stream_keeps_to_its_max_windows(
    tmp_path: Path, max_windows: int
) -> None:
    """Before: the stream's span counted ``max_windows`` from where it began, as if the peeks
    before it had committed nothing; and the choice weighed the whole backlog, so a run left
    one window opened the stream for it (with one peek left both decode the pin once)."""
    source = _pinned()
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x100,
                   max_windows=max_windows).run(time.monotonic())  # fmt: skip
    assert len(result.windows) <= max_windows
    ids = _ids_of(lake)
    assert ids == list(range(1, len(ids) + 1))  # each once, in order, none skipped
    if max_windows <= 4:  # one peek's span: the stream never pays
        assert result.reader == "peek" and source.streamed == []


def test_auto_with_the_per_message_decoder_says_why_it_peeks(tmp_path: Path) -> None:
    source = _pinned()
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x100,
                   columnar=False).run(time.monotonic())  # fmt: skip
    assert result.reader == "peek" and "columnar off" in (result.reader_note or "")


def test_an_unpinned_backlog_is_peeked_where_the_stream_could_be_opened(tmp_path: Path) -> None:
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x3000)
    source.streams = True
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x100).run(time.monotonic())  # fmt: skip
    assert result.reader == "peek" and source.streamed == []
    assert result.reader_note is not None and "peeks decode it faster" in result.reader_note
    assert _ids(lake) == [1, 2, 3, 4]


def _drain(src: Source, lake_root: str) -> dict[str, Any]:
    hook = DsnReplicationHook(src.dsn)
    lake = Lake(lake_root, src.slot, origins=hook.column_origins)
    with hook.writer_lock(src.slot) as lock:
        lake.writer_check = lock.check
        drain = Drain(source=hook, lake=lake, slot=src.slot, publications=[src.publication],
                      max_window_bytes=1 << 16)  # fmt: skip
        return drain.run(time.monotonic()).to_dict()


def test_live_a_backlog_peeks_and_a_slot_pinned_far_behind_streams(
    source: Source, tmp_path: Path
) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    fill = "INSERT INTO t SELECT g, repeat('v', 200) FROM generate_series(%s::int, %s) g"
    source.sql(fill, (1, 5000))  # about 1.3 MiB of WAL: five 256 KiB peeks
    peeked = _drain(source, str(tmp_path / "peeked"))
    assert peeked["reader"] == "peek" and "peeks decode it faster" in peeked["reader_note"]
    lake_root = str(tmp_path / "lake")  # a lake of its own: the pin moves the slot on

    with restart_lsn_pinned(source, behind=8 * MIB):  # the slot advanced past 8 MiB of WAL
        slot = source.hook().get_slot(source.slot)
        assert slot.restart_lsn is not None and slot.confirmed_flush_lsn is not None
        assert slot.confirmed_flush_lsn - slot.restart_lsn >= 8 * MIB, slot
        source.sql(fill, (5001, 10000))
        source.sql(FILLER, (64,))
        streamed = _drain(source, lake_root)
    assert streamed["reader"] == "stream", streamed
    assert "MiB behind the slot's position" in streamed["reader_note"]
    ids = sorted(r["id"] for r in changelog(lake_root, TableRef("public", "t")))
    assert ids == list(range(5001, 10001))  # each once
    position = Lake(lake_root, source.slot).position()
    assert source.hook().get_slot(source.slot).confirmed_flush_lsn == position


class _RepairInProgress:
    """A repair whose step is still going on when the run's own windows end (a backfill): the
    run drains on after it, once the source has moved (``repair.go_on``)."""

    def __init__(self, source: FakeSource) -> None:
        self.source, self.rounds = source, 0

    def __call__(self, gaps: Any) -> dict[str, Any]:
        return {}

    def in_progress(self) -> list[str]:
        return []

    def after_window(self, position: Any) -> None:
        pass

    def pending(self) -> bool:
        self.rounds += 1
        if self.rounds == 1:
            self.source.flush = LSN(0x3000)  # written while the step went on
        return self.rounds <= 2

    def waiting_for(self) -> None:
        return None

    def wait(self, seconds: float) -> None:
        pass

    def settle(self, failed: bool) -> None:
        pass

    def report(self) -> dict[str, Any]:
        return {}

    def parity_report(self) -> dict[str, Any]:
        return {}


def test_windows_peeked_after_a_run_with_nothing_to_read_say_peek(tmp_path: Path) -> None:
    """Before: the summary said ``reader="none"`` though the repair's rounds peeked windows."""
    source = _PeeksAsAServer(_transactions(30).rows, confirmed=0x1000, flush=0x1200)
    lake = Lake(str(tmp_path / "lake"), "s")
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=0x100).run(time.monotonic())  # fmt: skip
    repair = _RepairInProgress(source)  # (nothing to read at the run's start)
    result = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x100,
                   repair=repair).run(time.monotonic())  # type: ignore[arg-type]  # fmt: skip
    assert result.windows and result.reader != "none"
