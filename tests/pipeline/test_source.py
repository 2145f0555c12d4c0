"""What the drain needs of its source (``source``): a slot is drained only when it exists, is
pgoutput's, and is neither lost nor in use, named in that order."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import (
    SlotGoneUnderLakeError,
    SlotInUseError,
    SlotLostError,
    SlotNotFoundError,
    StandbyNotConfirmingError,
)
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.pipeline.source import check_slot
from tests.pipeline.test_drain import two_transactions
from tests.support.fake_source import FakeSource


@pytest.mark.unit
def test_a_slot_is_drained_only_when_neither_lost_nor_in_use() -> None:
    source = FakeSource([], confirmed=0x10, flush=0x10)
    assert check_slot(source, "s") is source.slot
    source.slot = dataclasses.replace(source.slot, wal_status="lost", active=True)
    with pytest.raises(SlotLostError, match="drop it"):
        check_slot(source, "s")
    source.slot = dataclasses.replace(source.slot, wal_status="reserved", active_pid=42)
    with pytest.raises(SlotInUseError, match="42"):
        check_slot(source, "s")


@pytest.mark.unit
def test_a_missing_slot_is_named_plainly_for_an_empty_lake(tmp_path: Path) -> None:
    source = FakeSource([], confirmed=0x10, flush=0x10)
    source.gone = True
    with pytest.raises(SlotNotFoundError) as info:
        check_slot(source, "s", Lake(str(tmp_path / "lake"), "s"))
    assert not isinstance(info.value, SlotGoneUnderLakeError)


@pytest.mark.unit
@pytest.mark.parametrize(("timeline", "said"), [(1, "it was dropped"), (2, "was promoted")])
def test_a_slot_missing_under_a_drained_lake_names_a_new_snapshot(
    tmp_path: Path, timeline: int, said: str
) -> None:
    """The lake holds changes of the slot: a slot of the same name created now would start past
    what the lake never saw. On a later timeline of the lake's system, a promotion lost it."""
    lake = Lake(str(tmp_path / "lake"), "s")
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x1300)
    Drain(source=source, lake=lake, slot="s", publications=["p"],
          max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    source.gone = True
    source.identity = {**source.identity, "timeline": timeline}
    with pytest.raises(SlotGoneUnderLakeError, match=said) as info:
        Drain(source=source, lake=lake, slot="s", publications=["p"],
              max_window_bytes=1024).run(time.monotonic())  # fmt: skip
    text = str(info.value)
    assert "0/1300" in text and "new initial snapshot into a new lake path" in text
    assert "failover slot" in text and lake.position() == LSN(0x1300)


@pytest.mark.unit
def test_a_failover_slot_whose_standby_is_away_is_refused_before_any_read() -> None:
    """Its reads would wait for the standby (WaitForStandbyConfirmation), silently, holding
    the lake's lock. Before, the run hung there. A slot that is no failover slot never waits."""
    source = FakeSource([], confirmed=0x10, flush=0x10)
    source.absent = ["standby_1"]
    assert check_slot(source, "s") is source.slot  # not a failover slot: not asked
    source.slot = dataclasses.replace(source.slot, failover=True)
    with pytest.raises(StandbyNotConfirmingError, match=r"\['standby_1'\].*Nothing was drained"):
        check_slot(source, "s")
    source.absent = []
    assert check_slot(source, "s") is source.slot


@pytest.mark.unit
def test_a_standby_that_goes_away_between_windows_stops_the_run_before_the_next_read(
    tmp_path: Path,
) -> None:
    """A read of a failover slot waits for the standbys as it begins: the run asks before each
    read (one peek reads a few windows). Before, only the run's start was asked, and a standby
    lost after it made the next read wait, silently, with the lake's lock held."""

    class Leaving(FakeSource):
        asked = 0

        def absent_standby_slots(self) -> list[str]:
            self.asked += 1
            return [] if self.asked <= 2 else ["standby_1"]  # the run's start, its first read

    source = Leaving(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.slot = dataclasses.replace(source.slot, failover=True)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180)
    with pytest.raises(StandbyNotConfirmingError, match=r"The \d windows committed before stay"):
        drain.run(time.monotonic())
    position = lake.position()
    assert position is not None and position < LSN(0x2000)
    assert source.advances[-1] == position  # what was committed, and nothing more
