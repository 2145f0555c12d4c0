"""A slot read through START_REPLICATION, on a live server: the same messages a peek gives,
the slot confirmed exactly where we say and never further, the walsender kept alive while we
are busy, and every way the stream can end named (a missing or busy slot, no replication
privilege, a terminated walsender, a connection cut) in one line. A walsender decoding a
transaction that sends nothing is waited for, and a stream that ends leaves the slot free
(``tests.support.silent_decode``; more in ``test_walsender``)."""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import time
from collections.abc import Iterator

import pytest
from psycopg import sql

from airflow_pglogrepl.exceptions import (
    SlotInUseError,
    SlotNotFoundError,
    SlotStreamError,
    SlotStreamUnavailableError,
)
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import PgOutputStream
from airflow_pglogrepl.postgres import walsender
from airflow_pglogrepl.postgres.slot_stream import SlotStream
from airflow_pglogrepl.postgres.source import PgSource
from airflow_pglogrepl.postgres.stream_frames import FrameBatch
from airflow_pglogrepl.postgres.walsender import synchronous_standby_match
from airflow_pglogrepl.testing.pgcluster import ClusterError
from tests.support.databases import Database
from tests.support.pg_proxy import pg_proxy
from tests.support.silent_decode import (
    FILTERED_OPTIONS,
    filtered_slot,
    write_silent_transaction,
)

OPTIONS = {"proto_version": "1", "publication_names": '"pub"', "messages": "false"}
_roles = itertools.count(1)


def _until(stream: SlotStream, end: LSN) -> Iterator[FrameBatch]:
    """The stream's batches until the server has sent everything before ``end``."""
    for batch in stream.batches():
        yield batch
        if batch.wal_end >= end:
            return


def _messages(stream: SlotStream, end: LSN) -> list[bytes]:
    return [m for batch in _until(stream, end) for m in batch.messages.to_pylist()]


@pytest.fixture
def slot(database: Database, slot_name: str) -> Iterator[tuple[PgSource, str]]:
    database.sql("CREATE TABLE t (id int PRIMARY KEY, at timestamptz, pad text);"
                 "CREATE PUBLICATION pub FOR TABLE t")  # fmt: skip
    source = PgSource(database.cluster.dsn(database.name))
    database.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot_name,))
    yield source, slot_name
    source.drop_slot(slot_name, missing_ok=True)


def test_the_stream_sends_what_a_peek_gives_and_confirms_exactly_what_we_say(
    database: Database, slot: tuple[PgSource, str]
) -> None:
    source, name = slot
    start = source.get_slot(name).confirmed_flush_lsn
    for setting in ("TimeZone TO 'Asia/Kolkata'", "DateStyle TO 'SQL, DMY'"):
        database.sql(sql.SQL("ALTER DATABASE {} SET " + setting).format(
            sql.Identifier(database.name)))  # fmt: skip
    database.sql("INSERT INTO t SELECT g, '2026-01-02 03:04:05+00', repeat('x', g)"
                 " FROM generate_series(1, 300) g")  # fmt: skip
    first_end = source.flush_lsn()
    database.sql("UPDATE t SET pad = 'y' WHERE id <= 10")
    end = source.flush_lsn()
    peeked = [bytes(d) for _, _, d in source.peek_changes(name, upto_lsn=end, options=OPTIONS)]
    with SlotStream(source.connection_params(), name, label="L", start=start, options=OPTIONS,
                    batch_bytes=4096) as stream:  # fmt: skip
        assert stream.slot_free is None  # not closed yet
        batches = list(_until(stream, end))
        assert len(batches) > 1
        streamed = [m for b in batches for m in b.messages.to_pylist()]
        assert streamed == peeked
        changes = [c for c in PgOutputStream.from_options(OPTIONS).decode(
            (LSN(0), None, m) for m in streamed) if c.__class__.__name__ == "Change"]  # fmt: skip
        # values print as the decoder reads them, whatever the database's settings say
        assert changes[0].new["at"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
        first_commit = first_end  # the first transaction commits before this
        stream.confirm(first_commit)
    assert source.get_slot(name).confirmed_flush_lsn == first_commit
    assert stream.slot_free is True
    # The slot is free once closed, and the rest comes again from where we confirmed.
    with SlotStream(source.connection_params(), name, label="L", start=start,
                    options=OPTIONS) as again:  # fmt: skip
        rest = _messages(again, end)
    assert rest[0][:1] == b"B" and len(rest) == 1 + 10 + 1 + 1  # Begin, Relation, 10 U, Commit
    assert source.get_slot(name).confirmed_flush_lsn == first_commit  # nothing confirmed


def test_a_slot_that_is_missing_or_busy_is_named(
    database: Database, slot: tuple[PgSource, str]
) -> None:
    source, name = slot
    params = source.connection_params()
    with pytest.raises(SlotNotFoundError, match="no_such_slot"):
        SlotStream(params, "no_such_slot", label="L", start=0, options=OPTIONS)
    with (
        SlotStream(params, name, label="L", start=0, options=OPTIONS),
        pytest.raises(SlotInUseError, match=name),
    ):
        SlotStream(params, name, label="L", start=0, options=OPTIONS)


def test_a_role_without_replication_cannot_stream_and_is_told_how_to_fix_it(
    database: Database, slot: tuple[PgSource, str]
) -> None:
    source, name = slot
    role = f"no_repl_{next(_roles)}"
    database.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'Secr3t-pw'")
    params = {**source.connection_params(), "user": role, "password": "Secr3t-pw"}
    descriptors = set(os.listdir("/proc/self/fd"))
    for _ in range(5):  # reader="auto" meets this on every run: nothing may leak
        with pytest.raises(SlotStreamUnavailableError) as caught:
            SlotStream(params, name, label="SRC", start=0, options=OPTIONS)
    # none left open (compared as sets: another thread of the worker, Spark's, may close one
    # meanwhile, which made a count differ by one in CI)
    assert set(os.listdir("/proc/self/fd")) <= descriptors
    assert "REPLICATION" in str(caught.value) and "reader='peek'" in str(caught.value)
    assert "Secr3t-pw" not in str(caught.value)


def test_a_terminated_walsender_ends_the_stream_with_a_retryable_error_and_keeps_the_confirm(
    database: Database, slot: tuple[PgSource, str]
) -> None:
    source, name = slot
    database.sql("INSERT INTO t VALUES (1, now(), 'a')")
    confirmed = source.flush_lsn()
    database.sql("INSERT INTO t VALUES (2, now(), 'b')")
    end = source.flush_lsn()
    with SlotStream(source.connection_params(), name, label="L", start=0,
                    options=OPTIONS) as stream:  # fmt: skip
        batches = stream.batches()
        seen = LSN(0)
        for batch in batches:
            seen = max(seen, batch.wal_end)
            if seen >= end:
                break
        stream.confirm(confirmed)
        # the confirm has reached the server once it shows; then its walsender is ended
        _wait_for(lambda: source.get_slot(name).confirmed_flush_lsn == confirmed)
        database.sql("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                     "WHERE slot_name = %s", (name,))  # fmt: skip
        with pytest.raises(SlotStreamError) as caught:
            for _ in batches:
                pass
    assert caught.value.retryable and name in str(caught.value)
    # the server's first line and its SQLSTATE, not libpq's text after it
    reason = caught.value.reason
    assert reason == "terminating connection due to administrator command (SQLSTATE 57P01)"
    assert source.get_slot(name).confirmed_flush_lsn == confirmed
    assert stream.slot_free is True


def test_a_cut_connection_ends_the_stream_with_its_reason_in_one_line(
    slot: tuple[PgSource, str],
) -> None:
    """Before: the reason was libpq's text whole, four lines ("server closed the connection
    unexpectedly", then "This probably means ..." and "connection not open"), which the
    drain's one-line warning and the task's error carried as they were."""
    source, name = slot
    params = source.connection_params()
    with pg_proxy((params["host"], int(params["port"]))) as proxy:
        stream = SlotStream({**params, "port": str(proxy.port)}, name, label="L", start=0,
                            options=OPTIONS)  # fmt: skip
        proxy.cut()
        with pytest.raises(SlotStreamError) as caught:
            for _ in stream.batches():
                pass
        stream.close()
    assert caught.value.reason == "server closed the connection unexpectedly"
    assert "\n" not in str(caught.value) and params["password"] not in str(caught.value)
    assert stream.slot_free is True  # its walsender saw the end, or was ended


def test_a_consumer_busy_longer_than_the_senders_timeout_is_not_cut_off(
    database: Database, slot: tuple[PgSource, str]
) -> None:
    """The reader answers for a consumer that stopped reading: the queue full, wal_sender_timeout
    at one second (a user setting), and the consumer away for three."""
    import time

    source, name = slot
    database.sql("INSERT INTO t SELECT g, now(), repeat('z', 2000) FROM generate_series(1, 4000) g")
    end = source.flush_lsn()
    params = {**source.connection_params(), "options": "-c wal_sender_timeout=1000"}
    with SlotStream(params, name, label="L", start=0, options=OPTIONS,
                    batch_bytes=64 << 10) as stream:  # fmt: skip
        batches = stream.batches()
        next(batches)
        time.sleep(3)  # the stimulus: three timeouts' worth of silence from the consumer
        for batch in batches:  # a SlotStreamError here: the server gave up on us
            if batch.wal_end >= end:
                break
        else:
            pytest.fail("the stream ended before the last change")


def test_a_server_shutting_down_is_not_kept_waiting_by_a_busy_consumer(
    database: Database, slot: tuple[PgSource, str]
) -> None:
    """Before: a reader that found the queue full stopped reading and went on answering. A
    walsender at shutdown waits until its client confirms everything it sent; the reader never
    read it asking, so ``pg_ctl stop -m fast`` waited for the consumer (a CI run failed on it).
    Now the server goes at once, and the consumer still gets every batch before the error."""
    source, name = slot
    # 39 kB of messages: four 8 kB batches fill the queue, the rest waits behind it, and the
    # walsender has sent everything (more would wait in the socket: the server must wait then)
    database.sql("INSERT INTO t SELECT g, now(), repeat('z', 100) FROM generate_series(1, 250) g")
    end = source.flush_lsn()
    cluster = database.cluster
    stream = SlotStream(source.connection_params(), name, label="L", start=0, options=OPTIONS,
                        batch_bytes=8 << 10)  # fmt: skip
    try:  # the consumer takes nothing
        _wait_for(lambda: database.sql(
            "SELECT sent_lsn >= %s::pg_lsn FROM pg_stat_replication WHERE pid = %s",
            (str(end), stream.walsender_pid)) == [(True,)])  # fmt: skip
        try:
            cluster.stop(timeout=20)  # the stimulus
        except ClusterError:  # the shared cluster is left up for the next test all the same
            stream.close()
            cluster.started = True
            cluster.stop()
            raise
        finally:
            cluster.start()
        received: list[bytes] = []
        with pytest.raises(SlotStreamError, match=r"shutting down|a shutdown"):
            for batch in stream.batches():
                received += batch.messages.to_pylist()
    finally:
        stream.close()
    inserts = [m for m in received if m[:1] == b"I"]
    assert len(inserts) == 250
    assert source.get_slot(name).confirmed_flush_lsn < end  # nothing confirmed for us


# -- a walsender decoding a transaction that sends nothing ------------------------------------

# The old limit, three status intervals, at a fraction of a second: a silence of seconds
# outlasts it many times over (the server's wal_sender_timeout is the cluster's 60 s).
QUICK_INTERVAL_S = 0.1


@pytest.fixture
def filtered(database: Database, slot_name: str) -> Iterator[tuple[PgSource, str, str]]:
    """``filtered_slot`` in a database of its own: the source, the slot, the DSN."""
    dsn = database.cluster.dsn(database.name)
    with filtered_slot(dsn, slot_name):
        yield PgSource(dsn), slot_name, dsn


def _inserts(stream: SlotStream, end: LSN) -> list[bytes]:
    return [m for m in _messages(stream, end) if m[:1] == b"I"]


def test_a_silent_decode_shorter_than_the_senders_timeout_does_not_end_the_stream(
    database: Database,
    filtered: tuple[PgSource, str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: three status intervals without a frame ended the stream whatever the server's
    wal_sender_timeout, though a walsender decoding such a transaction reads our request to
    answer only every half of it. Here 3 s of silence, the old limit 0.3 s, the timeout 60 s."""
    source, name, dsn = filtered
    monkeypatch.setattr(walsender, "STATUS_INTERVAL_S", QUICK_INTERVAL_S)
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.stream")
    write_silent_transaction(dsn, "fpub", "f", 3.0, pad_bytes=30)
    database.sql("INSERT INTO ok VALUES (1)")
    end = source.flush_lsn()
    with SlotStream(source.connection_params(), name, label="L", start=0,
                    options=FILTERED_OPTIONS) as stream:  # fmt: skip
        assert len(_inserts(stream, end)) == 1  # the row after it: the stream went through
    # within wal_sender_timeout: not even asked about (the check is for longer silences)
    assert "holds the slot but has sent nothing" not in caplog.text


def test_with_no_senders_timeout_a_silent_walsender_is_waited_for_while_it_holds_the_slot(
    database: Database,
    filtered: tuple[PgSource, str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """wal_sender_timeout = 0 (this connection's): the walsender reads our requests only every
    hundred changes, here 2 s apart, and sends nothing of its own. Past the limit (0.3 s) a
    session of its own finds our walsender still holding the slot: the stream waits, and says
    so."""
    source, name, dsn = filtered
    monkeypatch.setattr(walsender, "STATUS_INTERVAL_S", QUICK_INTERVAL_S)
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl.stream")
    write_silent_transaction(dsn, "fpub", "f", 4.0, pad_bytes=100)
    database.sql("INSERT INTO ok VALUES (1)")
    end = source.flush_lsn()
    params = {**source.connection_params(), "options": "-c wal_sender_timeout=0"}
    with SlotStream(params, name, label="L", start=0, options=FILTERED_OPTIONS) as stream:
        assert len(_inserts(stream, end)) == 1
        pid = stream.walsender_pid
    waited = [r for r in caplog.records if "holds the slot but has sent nothing" in r.message]
    assert waited and f"(pid {pid})" in waited[0].message, caplog.text
    assert waited[0].levelno == logging.INFO  # the first time; later ones warn


@pytest.mark.unit
def test_the_silence_limit_follows_the_senders_timeout() -> None:
    """Three status intervals, and never less than wal_sender_timeout and a margin; with no
    timeout, three intervals (a check follows every one). A walsender that holds the slot is
    borne four limits where it owes a keepalive every half timeout (15 and later), else half
    an hour."""
    assert walsender.silence_limit(10.0, 60.0) == 65.0
    assert walsender.silence_limit(10.0, 300.0) == 305.0
    assert walsender.silence_limit(10.0, 0.0) == 30.0
    assert walsender.silence_limit(walsender.status_interval(1.0), 1.0) == 6.0
    assert walsender.status_interval(0.0) == walsender.STATUS_INTERVAL_S == 10.0
    assert walsender.stuck_after(65.0, 60.0, 150000) == 260.0
    assert walsender.stuck_after(8.0, 3.0, 170000) == 32.0
    assert walsender.stuck_after(30.0, 0.0, 170000) == 1800.0
    assert walsender.stuck_after(65.0, 60.0, 140000) == 1800.0


def _wait_for(condition: object, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("setting", "name", "matches"),
    [
        ("", "airflow-pglogrepl", False),
        ("*", "airflow-pglogrepl", True),
        ("standby1, standby2", "airflow-pglogrepl", False),
        ("FIRST 1 (standby1, *)", "airflow-pglogrepl", True),
        ("ANY 2 (s1, AIRFLOW-PGLOGREPL)", "airflow-pglogrepl", True),
        ('2 (s1, "Airflow-PgLogRepl")', "airflow-pglogrepl", True),
        ('first 1 ("*")', "airflow-pglogrepl", False),  # a standby named "*", quoted
    ],
)
def test_a_walsender_the_server_would_wait_for_is_recognised(
    setting: str, name: str, matches: bool
) -> None:
    assert synchronous_standby_match(setting, name) is matches


@pytest.mark.unit
def test_only_reply_requests_in_quick_succession_are_taken_for_a_shutdown() -> None:
    """A walsender whose wal_sender_timeout was lowered by a reload asks every half timeout;
    one shutting down asks after every reply, many times a second."""
    import struct

    from airflow_pglogrepl.postgres.stream_frames import frames

    stream = object.__new__(SlotStream)
    stream.slot, stream._server, stream._asked = "s", "h:1", []
    ask = frames([struct.pack("!cQqB", b"k", 1, 0, 1)])
    stream._check_stopping(ask)
    stream._asked = [t - 2.0 for t in stream._asked]  # the last ask, two seconds ago
    stream._check_stopping(ask)  # one more: a timeout's ask, not a shutdown
    stream._check_stopping(ask)
    with pytest.raises(SlotStreamError, match="shutting down"):
        stream._check_stopping(ask)


def test_closing_a_stream_whose_walsender_decodes_silently_takes_seconds_not_half_a_minute(
    database: Database, filtered: tuple[PgSource, str, str]
) -> None:
    """A run ends (its last window committed) while the server decodes, past the run's end, a
    transaction that sends nothing: the walsender reads our CopyDone only at its next look at
    the socket, half its wal_sender_timeout (30 s) away. Before, close waited 30 s for it; now
    it waits ``CLOSE_TIMEOUT_S``, then the walsender is ended (``release``), the slot free, and
    close says the last confirm may not have reached the server (the drain then advances)."""
    source, name, dsn = filtered
    database.sql("INSERT INTO ok VALUES (1)")
    end = source.flush_lsn()
    write_silent_transaction(dsn, "fpub", "f", 45.0, pad_bytes=30)
    stream = SlotStream(source.connection_params(), name, label="L", start=0,
                        options=FILTERED_OPTIONS)  # fmt: skip
    assert len(_inserts(stream, end)) == 1
    began = time.monotonic()
    stream.close()
    took = time.monotonic() - began
    assert took < 15, f"close took {took:.1f} s"
    assert stream.slot_free is True
    assert source.get_slot(name).active_pid is None
