"""The columnar path's windows: where a window ends, and a stream's span cut at its end exactly
(a fake walsender that sends on past it, as a server does)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl.lake.delta import read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.pipeline.windows import window_end
from airflow_pglogrepl.tables import TableRef
from tests.support.fake_source import FakeSource
from tests.support.pgoutput_encoder import Session, relation

INT8, TEXT = 20, 25
ITEMS = TableRef("public", "items")


def test_a_window_ends_at_its_bound_or_just_past_a_commit_read_past_it() -> None:
    assert window_end(0x2000, []) == LSN(0x2000)
    assert window_end(0x2000, [0x1000, 0x1FFF]) == LSN(0x2000)
    assert window_end(0x2000, [0x1000, 0x2000]) == LSN(0x2001)
    assert window_end(0x2000, [0x2018]) == LSN(0x2019)


def three_transactions() -> Session:
    """Commits at 0x1100 and 0x1200, and one at 0x2100, past a flush position of 0x2000."""
    session = Session(start=0x1000)
    items = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    session.add(items).begin(700, 0x1100).insert(16384, b"1", b"one").insert(16384, b"2", b"two")
    session.commit(0x1100, 0x1108)
    session.begin(701, 0x1200).insert(16384, b"3", b"three").commit(0x1200, 0x1208)
    session.begin(702, 0x2100).insert(16384, b"4", b"four").commit(0x2100, 0x2108)
    return session


def _ids(lake: Lake) -> list[int]:
    return sorted(r["id"] for r in read_table(lake.paths.changes(ITEMS)).to_pylist())


@pytest.mark.parametrize("batch_messages", [1, 2, 100])
def test_a_stream_is_cut_at_the_runs_end_and_what_it_sent_past_it_is_left(
    tmp_path: Path, batch_messages: int
) -> None:
    """The walsender sends the transaction committing at 0x2100 too; the run ends at the flush
    position 0x2000, so it is neither stored nor confirmed: the next run gets it again."""
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.streams, source.batch_messages = True, batch_messages
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180,
                  reader="stream")  # fmt: skip
    result = drain.run(time.monotonic()).to_dict()
    assert result["reader"] == "stream" and result["reader_note"] is None
    assert [w for w in result["tables"].values()] == [3]
    assert _ids(lake) == [1, 2, 3] and lake.position() == LSN(0x2000)
    assert source.advances == []  # confirmed through the stream, never advanced
    (stream,) = source.streamed
    assert stream.confirms[-1] == LSN(0x2000)
    assert stream.confirms == sorted(stream.confirms)  # one per window, never lowered


def test_a_stream_span_of_max_windows_ends_at_its_bound(tmp_path: Path) -> None:
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.streams = True
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x180, max_windows=1,
                   reader="stream").run(time.monotonic())  # fmt: skip
    assert [(w.start, w.end, w.transactions) for w in result.windows] == [
        (LSN(0x1000), LSN(0x1180), 1)
    ]
    assert _ids(lake) == [1, 2]


def test_a_stopping_run_reads_a_batch_up_to_its_first_commit_and_no_further() -> None:
    import pyarrow as pa

    from airflow_pglogrepl.pipeline.windows import through_first_commit

    rows = three_transactions().rows
    data = pa.array([r[2] for r in rows], pa.large_binary())
    kinds = [m[:1] for m in data.to_pylist()]
    first = kinds.index(b"C")
    cut, end = through_first_commit(data.slice(2), LSN(0x1))  # starts inside a transaction
    assert cut.to_pylist() == data.to_pylist()[2 : first + 1] and end == LSN(0x1108)
    none, same = through_first_commit(data.slice(0, first), LSN(0x77))
    assert len(none) == first and same == LSN(0x77)


class _Fetched:
    """Batches of a stream, then its end: an error (the stream cut short) or none."""

    def __init__(self, batches: list[object], error: BaseException | None) -> None:
        self.batches, self.error = batches, error

    def __iter__(self) -> Iterator[object]:
        yield from self.batches
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        pass


@pytest.mark.parametrize("cut_short", [True, False])
def test_a_transaction_without_its_commit_is_said_truly_when_the_stream_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut_short: bool
) -> None:
    """Before: a stream cut short in the middle of a streamed transaction (a hand-over to the
    peek) warned that the transaction was still in progress at the source, though its commit
    may have been sent and lost with the stream. Now that case is said at INFO and claims
    nothing; a run that reached its end still warns of a transaction open at its end."""
    import pyarrow as pa

    from airflow_pglogrepl.exceptions import SlotStreamError
    from airflow_pglogrepl.pgoutput.messages import (
        InsertMessage,
        StreamStartMessage,
        StreamStopMessage,
    )
    from airflow_pglogrepl.pipeline.committer import WindowCommitter
    from airflow_pglogrepl.pipeline.windows import ColumnarWindows
    from tests.support.pgoutput_encoder import encode

    messages = [StreamStartMessage(600, True),
                relation(16384, "items", [("id", INT8, True), ("name", TEXT)], xid=600),
                InsertMessage(600, 16384, (b"1", b"one")), StreamStopMessage()]  # fmt: skip
    data = pa.array([encode(m) for m in messages], pa.large_binary())  # type: ignore[arg-type]
    source = FakeSource([], confirmed=0x1000, flush=0x2000)
    committer = WindowCommitter(source=source, lake=Lake(str(tmp_path / "lake"), "s"), slot="s",
                                publications=["p"], batch_rows=1000)  # fmt: skip
    options = {"proto_version": "2", "streaming": "on", "publication_names": "p"}
    windows = ColumnarWindows(committer, start=LSN(0x1000), span_end=LSN(0x2000),
                              window_bytes=0x1000, options=options, exact_end=True)  # fmt: skip
    fetched = _Fetched([data], SlotStreamError("s", "h:1", "lost") if cut_short else None)
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl")
    if cut_short:
        with pytest.raises(SlotStreamError):
            windows.run(fetched, [])
    else:
        windows.run(fetched, [])
    (said,) = [r for r in caplog.records if "transaction 600" in r.getMessage()]
    assert "still in progress" not in said.getMessage()
    if cut_short:
        assert said.levelno == logging.INFO and "before the stream ended" in said.getMessage()
    else:
        assert said.levelno == logging.WARNING and "had not committed" in said.getMessage()


@pytest.mark.parametrize("queue_bytes", [1 << 30, 1])
def test_a_tables_rows_are_written_once_they_fill_the_queue_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queue_bytes: int
) -> None:
    """A window writes a table's queued rows once they hold ``QUEUE_BYTES`` as well as
    ``batch_rows``: a transaction of wide rows bigger than a window was held whole until its
    window's commit (1.2 GB of driver memory for 700 MiB of WAL)."""
    from deltalake import DeltaTable

    from airflow_pglogrepl.pipeline import windows

    monkeypatch.setattr(windows, "QUEUE_BYTES", queue_bytes)
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.streams, source.batch_messages = True, 1
    lake = Lake(str(tmp_path / "lake"), "s")
    Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x1000,
          reader="stream").run(time.monotonic())  # fmt: skip
    assert _ids(lake) == [1, 2, 3]
    files = len(DeltaTable(lake.paths.changes(ITEMS)).file_uris())
    assert files == (1 if queue_bytes > 1 else 3)
