"""A stream's walsender seen from outside, on a live server: a silent stream whose walsender
cannot be found ends, and a stream that ends leaves the slot free at once, though its
walsender was still decoding (``tests.support.silent_decode``)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import SlotStreamError
from airflow_pglogrepl.hooks.pg import slot_stream, walsender
from airflow_pglogrepl.hooks.pg.slot_stream import SlotStream
from airflow_pglogrepl.hooks.pg.source import PgSource
from airflow_pglogrepl.testing.pgcluster import free_port
from tests.support.databases import Database
from tests.support.silent_decode import (
    FILTERED_OPTIONS,
    filtered_slot,
    write_silent_transaction,
)


@pytest.fixture
def filtered(database: Database, slot_name: str) -> Iterator[tuple[PgSource, str, str]]:
    """``filtered_slot`` in a database of its own: the source, the slot, the DSN."""
    dsn = database.cluster.dsn(database.name)
    with filtered_slot(dsn, slot_name):
        yield PgSource(dsn), slot_name, dsn


@pytest.mark.parametrize("check", ["unreachable", "gone"])
def test_a_silent_stream_whose_walsender_cannot_be_found_ends_and_leaves_the_slot_free(
    filtered: tuple[PgSource, str, str], monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """Past the limit the check finds the server unreachable for a new session (a frozen host,
    a partition) or our walsender no longer holding the slot (both made so by the test): the
    stream ends at once, with a retryable error that names why and no password. The
    walsender, in fact still decoding, would hold the slot for seconds more: ``close``
    returns only once it is free, so an immediate peek (a retry, the drain's fallback) does
    not meet SlotInUseError."""
    source, name, dsn = filtered
    monkeypatch.setattr(slot_stream, "STATUS_INTERVAL_S", 0.1)  # the limit: 0.3 s
    monkeypatch.setattr(walsender, "RELEASE_WAIT_S", 0.5)
    first = itertools.count()
    if check == "unreachable":
        side = walsender.side_session

        def session(params: dict[str, str], label: str) -> Any:
            if next(first) == 0:  # the silence check's: nothing listens there
                params = {**params, "port": str(free_port())}
            return side(params, label)

        monkeypatch.setattr(walsender, "side_session", session)
    else:
        holder = walsender.slot_holder

        def holding(conn: Any, slot: str) -> int | None:
            return None if next(first) == 0 else holder(conn, slot)

        monkeypatch.setattr(walsender, "slot_holder", holding)
    start = source.get_slot(name).confirmed_flush_lsn
    write_silent_transaction(dsn, "fpub", "f", 5.0, pad_bytes=100)
    end = source.flush_lsn()
    # no timeout: the limit is three status intervals, and the walsender answers only every
    # hundred changes, here 2 s apart
    params = {**source.connection_params(), "options": "-c wal_sender_timeout=0"}
    stream = SlotStream(params, name, label="L", start=0, options=FILTERED_OPTIONS)
    try:
        with pytest.raises(SlotStreamError) as caught:
            for batch in stream.batches():
                if batch.wal_end >= end:
                    pytest.fail("the stream went through the silence: the check never failed")
    finally:
        began = time.monotonic()
        stream.close()
        closed_in = time.monotonic() - began
    why = "could not ask whether" if check == "unreachable" else "no longer holds the slot"
    assert caught.value.retryable and why in str(caught.value), caught.value
    assert params["password"] not in str(caught.value)
    assert source.get_slot(name).active_pid is None  # free as close returns, not seconds later
    assert list(source.peek_changes(name, upto_lsn=start, options=FILTERED_OPTIONS)) == []
    assert closed_in < 10  # bounded: the terminated walsender ends within milliseconds


def test_release_returns_at_once_when_the_walsender_let_go(
    filtered: tuple[PgSource, str, str],
) -> None:
    """The common case, every stream's close: one look, no wait, nothing terminated."""
    source, name, _ = filtered
    params = source.connection_params()
    with SlotStream(params, name, label="L", start=0, options=FILTERED_OPTIONS) as stream:
        pid = stream.walsender_pid
        assert source.get_slot(name).active_pid == pid
        assert walsender.gone(params, name, pid, label="L", secrets=[]) is None
    began = time.monotonic()
    walsender.release(params, name, pid, label="L", secrets=[])
    assert time.monotonic() - began < 1
    assert walsender.gone(params, name, pid, label="L", secrets=[]) is not None
