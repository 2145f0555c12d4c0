"""Reading the slot through the stream: when a run streams, falls back to the peek or refuses,
how its windows are confirmed through unpublished traffic, and how its end hands over to the
peek (a fake walsender, ``tests.support.fake_source.FakeStream``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.drain import Drain
from tests.pipeline.test_windows import _ids, three_transactions
from tests.support.fake_source import FakeSource


def test_a_refused_stream_falls_back_to_the_peek_and_says_why(tmp_path: Path) -> None:
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x3000)
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x1000).run(time.monotonic()).to_dict()  # fmt: skip
    assert result["reader"] == "peek" and "this fake is peeked" in result["reader_note"]
    assert _ids(lake) == [1, 2, 3, 4]


def test_reader_stream_refuses_instead_of_falling_back(tmp_path: Path) -> None:
    from airflow_pglogrepl.exceptions import SlotStreamUnavailableError

    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x2000)
    lake = Lake(str(tmp_path / "lake"), "s")
    with pytest.raises(SlotStreamUnavailableError, match="reader='peek'"):
        Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x1000,
              reader="stream").run(time.monotonic())  # fmt: skip
    assert lake.position() is None


def test_through_unpublished_traffic_a_stream_commits_and_confirms_window_by_window(
    tmp_path: Path,
) -> None:
    """No published change, 16 KiB of WAL: the server's position alone cuts the windows, so
    the slot moves on as the peek's empty windows move it, not only at the run's end."""
    source = FakeSource([], confirmed=0x1000, flush=0x5000)
    source.streams = True
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x1000).run(time.monotonic())  # fmt: skip
    assert [int(w.end) for w in result.windows] == [0x2000, 0x3000, 0x4000, 0x5000]
    (stream,) = source.streamed
    assert [int(c) for c in stream.confirms] == [0x2000, 0x3000, 0x4000, 0x5000]


def test_a_stream_that_declined_and_could_not_confirm_never_hands_over_to_the_peek(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The columnar decoder declines after a window committed, the stream ended on its own
    (its last confirm lost) and the slot cannot be advanced either: the peek would read from
    the slot's older position and store that window again. The run stops instead."""
    from airflow_pglogrepl.changelog.columnar import ColumnarDecoder, ColumnarUnsupportedError
    from airflow_pglogrepl.exceptions import SlotInUseError, SlotStreamError

    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x3000)
    source.streams, source.batch_messages = True, 2
    source.stream_ends_unclean = True
    parts = ColumnarDecoder.parts
    calls = iter(range(100))

    def declining(self: ColumnarDecoder, data: object) -> object:
        if next(calls) == 4:  # past the first window's commit
            raise ColumnarUnsupportedError("a message type the test says it cannot take")
        return parts(self, data)  # type: ignore[arg-type]

    def busy(name: str, upto: object) -> LSN:
        raise SlotInUseError(name, 4242)

    monkeypatch.setattr(ColumnarDecoder, "parts", declining)
    monkeypatch.setattr(source, "advance_slot", busy)
    lake = Lake(str(tmp_path / "lake"), "s")
    with pytest.raises(SlotStreamError, match="before the slot could be confirmed"):
        Drain(source=source, lake=lake, slot="s", publications=["p"],
              max_window_bytes=0x180).run(time.monotonic())  # fmt: skip
    assert _ids(lake) == [1, 2] and lake.position() == LSN(0x1180)
