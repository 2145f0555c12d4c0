"""A stream's walsender seen from outside, on a live server: a silent stream whose walsender
cannot be found ends, one that holds the slot but is stuck ends too, one decoding is waited
for; a stream that ends leaves the slot free at once, though its walsender was still decoding
(``tests.support.silent_decode``), and says whether it did (``slot_free``). The walsender is
the server's process whatever a proxy reports, and asked about on its own server whatever
hosts the parameters list."""

from __future__ import annotations

import itertools
import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import SlotStreamError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres import walsender
from airflow_pglogrepl.postgres.slot_stream import SlotStream
from airflow_pglogrepl.postgres.source import PgSource
from airflow_pglogrepl.testing.pgcluster import PgCluster, free_port
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.databases import Database
from tests.support.pg_proxy import error_within, pg_proxy
from tests.support.silent_decode import (
    FILTERED_OPTIONS,
    filtered_slot,
    write_silent_transaction,
)

WAITED = "holds the slot but has sent nothing"  # what the stream logs as it waits


@pytest.fixture
def filtered(database: Database, slot_name: str) -> Iterator[tuple[PgSource, str, str]]:
    """``filtered_slot`` in a database of its own: the source, the slot, the DSN."""
    dsn = database.cluster.dsn(database.name)
    with filtered_slot(dsn, slot_name):
        yield PgSource(dsn), slot_name, dsn


def _inserts_until(stream: SlotStream, end: LSN) -> int:
    """The inserts the stream sends until the server has sent everything before ``end``."""
    count = 0
    for batch in stream.batches():
        count += sum(1 for m in batch.messages.to_pylist() if m[:1] == b"I")
        if batch.wal_end >= end:
            return count
    raise AssertionError("the stream ended before the end")


@pytest.mark.parametrize("check", ["unreachable", "gone"])
def test_a_silent_stream_whose_walsender_cannot_be_found_ends_and_leaves_the_slot_free(
    filtered: tuple[PgSource, str, str], monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """Past the limit the check finds the server unreachable for a new session (a frozen host,
    a partition) or our walsender no longer holding the slot (both made so by the test): the
    stream ends at once, with a retryable error that names why and no password. The
    walsender, in fact still decoding, would hold the slot for seconds more: ``close``
    returns only once it is free, so an immediate peek (a retry, the drain's fallback) does
    not meet SlotInUseError, and says so (``slot_free``)."""
    source, name, dsn = filtered
    monkeypatch.setattr(walsender, "STATUS_INTERVAL_S", 0.1)  # the limit: 0.3 s
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
        holder = walsender.slot_holder_wait

        def holding(conn: Any, slot: str) -> tuple[int | None, str | None]:
            return (None, None) if next(first) == 0 else holder(conn, slot)

        monkeypatch.setattr(walsender, "slot_holder_wait", holding)
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
    assert stream.slot_free is True
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
        assert walsender.look(params, name, pid, label="L", secrets=[]).gone is None
    began = time.monotonic()
    assert walsender.release(params, name, pid, label="L", secrets=[]) is True
    assert time.monotonic() - began < 1
    assert walsender.look(params, name, pid, label="L", secrets=[]).gone is not None


def test_a_stream_that_cannot_see_the_slot_free_says_so(
    filtered: tuple[PgSource, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``release`` returned nothing, so a stream closed against a server out of reach
    looked like any other, and the drain peeked a slot its walsender might still hold. Now
    ``slot_free`` is None until ``close``, then False when the slot could not be seen free."""
    source, name, _ = filtered
    params = source.connection_params()
    stream = SlotStream(params, name, label="L", start=0, options=FILTERED_OPTIONS)
    assert stream.slot_free is None
    side = walsender.side_session
    monkeypatch.setattr(walsender, "side_session",
                        lambda p, label: side({**p, "port": str(free_port())}, label))  # fmt: skip
    stream.close()
    assert stream.slot_free is False  # unknown: not free
    unreachable = {**params, "port": str(free_port())}
    assert walsender.release(unreachable, name, 1, label="L", secrets=[]) is False


def test_a_walsender_that_holds_the_slot_but_sends_nothing_is_not_waited_for_for_ever(
    database: Database,
    filtered: tuple[PgSource, str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a walsender alive but stuck (SIGSTOP here; a hung disk, a starved host) was
    found holding the slot at every check and waited for without end, an INFO line each time.
    Now, as it owes a keepalive every half wal_sender_timeout (1 s here), it is borne four
    limits (of 1.5 s here: the margin shortened), then the stream ends with an error naming
    its pid, the silence, its wait event and where to look; the checks between warn from the
    second on. ``close`` cannot end a stopped process: ``slot_free`` is False."""
    source, name, _ = filtered
    monkeypatch.setattr(walsender, "SILENCE_MARGIN_S", 0.5)  # limit 1.5 s, stuck after 6 s
    monkeypatch.setattr(walsender, "RELEASE_WAIT_S", 0.2)
    monkeypatch.setattr(walsender, "TERMINATE_WAIT_S", 0.5)
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.stream")
    params = {**source.connection_params(), "options": "-c wal_sender_timeout=1000"}
    stream = SlotStream(params, name, label="L", start=0, options=FILTERED_OPTIONS)
    pid = stream.walsender_pid
    waits = "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s"
    # stopped while it waits for WAL, not inside a lock other sessions may want
    wait_type, wait_event = wait_until(
        lambda: next((r for r in database.sql(waits, (pid,)) if r[0] == "Client"), None),
        what="the walsender waiting for WAL",
    )
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        error = error_within(lambda: list(stream.batches()), 60)
        took = time.monotonic() - began
        stream.close()  # while it is still stopped
    finally:
        os.kill(pid, signal.SIGCONT)
        stream.close()
    assert isinstance(error, SlotStreamError) and error.retryable, error
    for part in (f"pid {pid}", "still holds the slot", f"wait event: {wait_type}/{wait_event}",
                 "pg_stat_activity", f"pg_terminate_backend({pid})"):  # fmt: skip
        assert part in str(error), (part, str(error))
    silence = re.search(r"sent nothing for (\d+) s", str(error))
    assert silence and 6 <= int(silence.group(1)) < 10, str(error)
    assert 5 < took < 20, took
    assert stream.slot_free is False
    levels = [r.levelno for r in caplog.records if WAITED in r.message]
    assert levels[0] == logging.INFO and set(levels[1:]) == {logging.WARNING}, caplog.text
    # continued, the walsender ends: it was terminated
    wait_until(lambda: source.get_slot(name).active_pid is None, what="the slot free")


def test_a_walsender_decoding_with_a_timeout_sends_keepalives_and_is_waited_for(
    database: Database,
    filtered: tuple[PgSource, str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bound above counts silence, not the decode: a walsender decoding a transaction
    that sends nothing for longer than it (8 s against 6 s) sends a keepalive every hundred
    changes once half its timeout passed (here 2 s apart), and the stream goes through."""
    source, name, dsn = filtered
    monkeypatch.setattr(walsender, "SILENCE_MARGIN_S", 0.5)  # limit 1.5 s, stuck after 6 s
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.stream")
    write_silent_transaction(dsn, "fpub", "f", 8.0, pad_bytes=100)
    database.sql("INSERT INTO ok VALUES (1)")
    end = source.flush_lsn()
    params = {**source.connection_params(), "options": "-c wal_sender_timeout=1000"}
    began = time.monotonic()
    with SlotStream(params, name, label="L", start=0, options=FILTERED_OPTIONS) as stream:
        assert _inserts_until(stream, end) == 1
    assert time.monotonic() - began > 6  # longer than the bound: the keepalives reset it
    assert "is stuck" not in caplog.text


def test_the_walsender_pid_is_the_servers_though_a_proxy_reports_its_own(
    filtered: tuple[PgSource, str, str],
) -> None:
    """Before: the PID was ``conn.info.backend_pid``, which a proxy (PgBouncer) reports as
    its own; the silence check then found "our" walsender gone from the slot, and ``release``
    the slot free, whatever the server's walsender did. Now it is asked of the server."""
    source, name, _ = filtered
    params = source.connection_params()
    fake = os.getpid()  # no server process has it
    with pg_proxy((params["host"], int(params["port"])), fake_pid=fake) as proxy:
        through = {**params, "port": str(proxy.port), "sslmode": "disable",
                   "gssencmode": "disable"}  # fmt: skip
        with psycopg.connect(conninfo.make_dsn(through)) as plain:
            assert plain.info.backend_pid == fake  # what the proxy reports
        with SlotStream(through, name, label="L", start=0, options=FILTERED_OPTIONS) as stream:
            assert stream.walsender_pid == source.get_slot(name).active_pid != fake


def test_side_sessions_ask_the_server_the_stream_reached_not_another_of_its_hosts(
    database: Database,
    filtered: tuple[PgSource, str, str],
    subscriber: PgCluster,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Before: the side sessions were opened with the stream's parameters again: with several
    hosts (or ``load_balance_hosts``) they could reach another server than the walsender's.
    Here the first host is down as the stream connects (so it reaches the second), and up
    afterwards: another server, with a database of the same name and no such slot. The
    silence checks ask the stream's own server, find its walsender decoding, and wait."""
    source, name, dsn = filtered
    params = source.connection_params()
    monkeypatch.setattr(walsender, "STATUS_INTERVAL_S", 0.1)  # the limit: 0.3 s
    subscriber.create_database(database.name)
    try:
        with pg_proxy((subscriber.host, subscriber.port), listening=False) as other:
            passfile = tmp_path / "pgpass"  # a password for each server
            passfile.write_text(
                f"127.0.0.1:{other.port}:*:{subscriber.superuser}:{_pgpass(subscriber.password)}\n"
                f"127.0.0.1:{params['port']}:*:{params['user']}:{_pgpass(params['password'])}\n"
            )
            passfile.chmod(0o600)
            listed = {key: value for key, value in params.items() if key != "password"}
            listed.update(host="127.0.0.1,127.0.0.1", port=f"{other.port},{params['port']}",
                          passfile=str(passfile),
                          options="-c wal_sender_timeout=0")  # fmt: skip
            write_silent_transaction(dsn, "fpub", "f", 3.0, pad_bytes=100)
            database.sql("INSERT INTO ok VALUES (1)")
            end = source.flush_lsn()
            with SlotStream(listed, name, label="L", start=0, options=FILTERED_OPTIONS) as stream:
                other.listen()  # the first host is back: another server
                assert _inserts_until(stream, end) == 1
            assert stream.slot_free is True
    finally:
        subscriber.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(
            sql.Identifier(database.name)))  # fmt: skip


def _pgpass(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


@pytest.mark.unit
def test_a_reason_is_one_line_with_its_sqlstate_and_no_secret() -> None:
    """libpq's text runs over lines that say nothing more; the server's SQLSTATE says what
    happened in a form one can search for."""
    lost = psycopg.OperationalError(
        "server closed the connection unexpectedly (password Secr3t-pw)\n\tThis probably means"
        " the server terminated abnormally\n\tbefore or while processing the request.\n"
    )
    assert walsender.brief(lost, ["Secr3t-pw"]) == (
        "server closed the connection unexpectedly (password ***)"
    )
    ended = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert walsender.brief(ended, []) == (
        "terminating connection due to administrator command (SQLSTATE 57P01)"
    )


@pytest.mark.unit
def test_with_no_senders_timeout_a_walsender_that_holds_the_slot_is_borne_half_an_hour(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """wal_sender_timeout = 0 promises no keepalive: a walsender holding the slot is waited
    for, a check every 30 s (INFO, then WARNING), until half an hour of silence."""
    monkeypatch.setattr(walsender, "look", lambda *a, **k: walsender.Look(None, "IO/WALRead"))
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.stream")
    silence = walsender.Silence({}, "s", 42, server="h:1", label="L", secrets=[],
                                sender_timeout_s=0.0, server_version=170000)  # fmt: skip
    assert (silence.limit, silence.stuck_after) == (30.0, 1800.0)
    now = time.monotonic()
    silence.check(now - 29)  # within the limit: not even asked
    silence.check(now - 31)
    silence._checked_at -= 31  # a limit later, still silent
    silence.check(now - 62)
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING]
    assert "wait event: IO/WALRead" in caplog.records[0].message
    silence._checked_at -= 31
    with pytest.raises(SlotStreamError, match=r"pid 42\) still holds the slot but has sent "
                       r"nothing for 1801 s.*no decode that sends nothing lasts"):  # fmt: skip
        silence.check(now - 1801)
