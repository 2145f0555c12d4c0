"""The columnar path's windows: where a window ends, and a stream's span cut at its end exactly
(a fake walsender that sends on past it, as a server does)."""

from __future__ import annotations

import time
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
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180)
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
                   max_window_bytes=0x180, max_windows=1).run(time.monotonic())  # fmt: skip
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
