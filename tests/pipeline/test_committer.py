"""The last stage of a window: rows written, the window committed to the lake, and only then the
slot moved, by the reader's confirm while one reads (``WindowCommitter``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import PublicationNotFoundError, WriterLockLostError
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.committer import WindowCommitter
from airflow_pglogrepl.pipeline.results import WindowStats
from tests.support.fake_source import FakeSource
from tests.support.lake_batches import A, batch


def _committer(tmp_path: Path, source: FakeSource, **lake: Any) -> WindowCommitter:
    return WindowCommitter(source=source, lake=Lake(str(tmp_path / "lake"), "s", **lake),
                           slot="s", publications=["p"], batch_rows=10)  # fmt: skip


@pytest.mark.unit
def test_a_window_is_committed_then_the_slot_moves_to_its_end(tmp_path: Path) -> None:
    source = FakeSource([], confirmed=0x100, flush=0x300)
    committer = _committer(tmp_path, source)
    window = committer.open(LSN(0x100))
    stats = WindowStats(start=LSN(0x100), end=LSN(0x200))
    committer.write(window, A, batch((1, 0x110, 1)), stats)
    committer.commit(window, stats, 0.0)
    assert committer.lake.position() == LSN(0x200) and source.advances == [LSN(0x200)]
    assert stats.tables == {str(A): 1}


@pytest.mark.unit
def test_a_readers_confirm_takes_the_ends_while_it_reads_and_only_then(tmp_path: Path) -> None:
    """Each end is confirmed once the lake holds the window (its position is there already)."""
    source = FakeSource([], confirmed=0x100, flush=0x300)
    committer = _committer(tmp_path, source)
    confirmed: list[tuple[LSN, LSN | None]] = []
    with committer.confirming(lambda end: confirmed.append((end, committer.lake.position()))):
        committer.commit(committer.open(LSN(0x100)), WindowStats(LSN(0x100), LSN(0x200)), 0.0)
    committer.commit(committer.open(LSN(0x200)), WindowStats(LSN(0x200), LSN(0x280)), 0.0)
    assert confirmed == [(LSN(0x200), LSN(0x200))] and source.advances == [LSN(0x280)]


@pytest.mark.unit
def test_nothing_is_committed_without_the_publications_or_the_lock(tmp_path: Path) -> None:
    source = FakeSource([], confirmed=0x100, flush=0x300)
    source.dropped_publications.add("p")
    committer = _committer(tmp_path, source)
    with pytest.raises(PublicationNotFoundError):
        committer.commit(committer.open(LSN(0x100)), WindowStats(LSN(0x100), LSN(0x200)), 0.0)
    assert committer.lake.position() is None and source.advances == []

    def lost() -> None:
        raise WriterLockLostError("s", "its session failed: terminated")

    source.dropped_publications.clear()
    locked = _committer(tmp_path / "other", source, writer_check=lost)
    with pytest.raises(WriterLockLostError):
        locked.commit(locked.open(LSN(0x100)), WindowStats(LSN(0x100), LSN(0x200)), 0.0)
    assert source.advances == []
