"""The two readers behind one face (``readers``): a peek's span as batches without a WAL end, the
stream's cut at a span's end, the drain's pgoutput options, and the one-change peek that tells
whether anything published waits."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.readers import (
    PeekReader,
    StreamReader,
    peek_options,
    published_before,
    stream_options,
)
from tests.support.fake_source import FakeSource
from tests.support.pgoutput_encoder import Session, relation

INT8 = 20


def _two_transactions() -> Session:
    session = Session(start=0x1000)
    session.add(relation(16384, "items", [("id", INT8, True)]))
    session.begin(700, 0x1100).insert(16384, b"1").commit(0x1100, 0x1108)
    session.begin(701, 0x1200).insert(16384, b"2").commit(0x1200, 0x1208)
    return session


@pytest.mark.unit
def test_the_drains_options_name_its_publications_and_the_streams_ask_for_more() -> None:
    options = peek_options(["b", 'we"ird'])
    assert options["proto_version"] == "1" and options["messages"] == "false"
    assert options["publication_names"] == '"b","we""ird"'
    assert stream_options(options) == {**options, "proto_version": "2", "streaming": "on"}


@pytest.mark.unit
def test_a_peek_gives_batches_without_a_wal_end_and_advances_the_slot() -> None:
    source = FakeSource(_two_transactions().rows, confirmed=0x1000, flush=0x2000)
    reader = PeekReader(source, "s", peek_options(["p"]))
    assert not reader.exact_end and reader.follow is None
    batches = reader.batches(LSN(0x1000), LSN(0x2000))
    items: list[Any] = list(batches)
    assert items and all(end is None for _, end in items)
    batches.close()  # type: ignore[attr-defined]
    reader.confirm(LSN(0x1180))
    assert source.advances == [LSN(0x1180)]


@pytest.mark.unit
def test_the_stream_is_read_up_to_a_spans_end_and_confirms_without_advancing() -> None:
    source = FakeSource(_two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.streams = True
    options = stream_options(peek_options(["p"]))
    stream = source.stream_slot("s", start=LSN(0x1000), options=options)
    reader = StreamReader(stream, None)
    assert reader.exact_end
    ends = [end for _, end in reader.batches(LSN(0x1000), LSN(0x1109))]
    assert ends and ends[-1] is not None and ends[-1] >= LSN(0x1109)
    reader.confirm(LSN(0x1109))
    assert source.advances == [] and stream.confirms == [LSN(0x1109)]


@pytest.mark.unit
def test_a_published_change_before_an_end_is_seen_with_one_peek() -> None:
    source = FakeSource(_two_transactions().rows, confirmed=0x1000, flush=0x2000)
    options = peek_options(["p"])
    assert published_before(source, "s", options, LSN(0x2000))
    assert not published_before(source, "s", options, LSN(0x1000))
    assert source.advances == []
