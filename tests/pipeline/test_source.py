"""What the drain needs of its source (``source``): a slot is drained only when it exists, is
pgoutput's, and is neither lost nor in use, named in that order."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_pglogrepl.exceptions import SlotInUseError, SlotLostError
from airflow_pglogrepl.pipeline.source import check_slot
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
