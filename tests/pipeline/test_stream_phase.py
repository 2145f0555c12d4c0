"""Reading the slot through the stream: when a run streams, falls back to the peek or refuses,
how its windows are confirmed through unpublished traffic, and how its end hands over to the
peek (a fake walsender, ``tests.support.fake_source.FakeStream``); live, a stream that ends
early hands over to the peek, and a transaction decoded for long without output is waited
for (``tests.support.silent_decode``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_pglogrepl.exceptions import SlotInUseError, SlotStreamError
from airflow_pglogrepl.faults import FAULT_ENV
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.wait import wait_until
from tests.pipeline.test_windows import _ids, three_transactions
from tests.support.drain import changelog
from tests.support.fake_source import FakeSource, FakeStream
from tests.support.silent_decode import (
    create_filtered_publication,
    decode_cost_s,
    write_silent_transaction,
)
from tests.support.sources import Source
from tests.support.wal import FILLER, restart_lsn_pinned


def test_a_refused_stream_falls_back_to_the_peek_and_says_why(tmp_path: Path) -> None:
    """The slot pinned: "auto" chooses the stream, which this fake refuses."""
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x3000, restart=0)
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x100).run(time.monotonic()).to_dict()  # fmt: skip
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
    """No published change, 32 KiB of WAL, the server's position told every 4 KiB: that alone
    cuts the windows, so the slot moves on before the run's end, in windows each twice the
    size of the one before (a few commits, however far the WAL goes)."""
    import pyarrow as pa

    from tests.support.fake_source import FakeStream

    class Keepalives(FakeStream):
        def batches(self) -> Any:
            for end in range(0x2000, 0x9001, 0x1000):
                yield SimpleNamespace(messages=pa.array([], pa.large_binary()), wal_end=LSN(end))

    source = FakeSource([], confirmed=0x1000, flush=0x9000)
    source.streams = True
    source.stream_slot = lambda slot, *, start, options, alive=None: Keepalives(  # type: ignore[method-assign]
        source, start, dict(options))  # fmt: skip
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x1000, reader="stream").run(time.monotonic())  # fmt: skip
    assert [int(w.end) for w in result.windows] == [0x2000, 0x4000, 0x8000, 0x9000]
    (stream,) = source.streamed
    assert [int(c) for c in stream.confirms] == [0x2000, 0x4000, 0x8000, 0x9000]


def test_a_stream_that_declined_and_could_not_confirm_never_hands_over_to_the_peek(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The columnar decoder declines after a window committed, the stream ended on its own
    (its last confirm lost) and the slot cannot be advanced either: the peek would read from
    the slot's older position and store that window again. The run stops instead."""
    from airflow_pglogrepl.changelog.columnar import ColumnarDecoder, ColumnarUnsupportedError

    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x3000, restart=0)
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


class _EndsEarly(FakeStream):
    """A walsender that goes away before its fifth batch (past the first window's commit):
    the stream raises, and the confirms sent never reached the server."""

    def batches(self) -> Any:
        for n, batch in enumerate(super().batches()):
            if n == 4:
                raise SlotStreamError("s", "h:1", "the connection was lost")
            yield batch

    def close(self) -> bool:
        return False


class _PeeksAsAServer(FakeSource):
    """A fake whose peek skips, as a server's does, every row of the transactions that commit
    before the slot's position (the base fake skips the rows before it), and sends the
    Relations again: a peek from the middle of a stream's span reads what a server sends."""

    def peek_changes(
        self, slot: str, *, upto_lsn: LSN | str | None, options: Any, batch_rows: int = 5000,
        upto_nchanges: int | None = None,
    ) -> Any:  # fmt: skip
        start = self.slot.confirmed_flush_lsn
        assert start is not None and upto_lsn is not None
        final = None  # the commit LSN of the transaction the row is in (a Begin's final LSN)
        for row in self.rows:
            if row[2][:1] == b"B":
                final = int.from_bytes(row[2][1:9], "big")
            if final is None or int(start) <= final < int(LSN(upto_lsn)):
                yield row
            if row[2][:1] == b"C":
                final = None


def _ending_early() -> _PeeksAsAServer:
    """Three transactions (commits at 0x1100, 0x1200, 0x2100, flush 0x3000), streamed by a
    walsender that goes away after the first window (``_EndsEarly``); restart_lsn is pinned far
    enough behind that "auto" reads with the stream."""
    source = _PeeksAsAServer(three_transactions().rows, confirmed=0x1000, flush=0x3000,
                             restart=0)  # (pinned: "auto" chooses the stream)  # fmt: skip
    source.streams, source.batch_messages = True, 2
    source.stream_slot = lambda slot, *, start, options, alive=None: _EndsEarly(  # type: ignore[method-assign]
        source, start, dict(options))  # fmt: skip
    return source


@pytest.mark.parametrize("reader", ["auto", "stream"])
def test_a_stream_that_ends_early_hands_over_to_the_peek_with_auto_and_every_row_lands_once(
    tmp_path: Path, reader: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the stream's error failed the run, and its retry met the same end. With
    ``auto`` the run now confirms the slot where the stream's last window ended (its confirm
    went nowhere) and peeks the rest from there: nothing twice, nothing missing, and the
    summary and the log say why. ``reader="stream"`` still fails, its window kept."""
    source = _ending_early()
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180,
                  reader=reader)  # fmt: skip
    if reader == "stream":
        with pytest.raises(SlotStreamError, match="the connection was lost"):
            drain.run(time.monotonic())
        assert _ids(lake) == [1, 2]
        return
    result = drain.run(time.monotonic()).to_dict()
    assert _ids(lake) == [1, 2, 3, 4] and lake.position() == LSN(0x3000)
    assert source.advances[0] == LSN(0x1180)  # the stream's window, confirmed the peek's way
    assert result["reader"] == "stream"
    assert "ended early (the connection was lost); from 0/1180" in result["reader_note"]
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "goes on reading the slot with peeks" in warning.getMessage()


class _HoldsTheSlot(_EndsEarly):
    """As ``_EndsEarly``, and its walsender was not seen to let go of the slot."""

    slot_free = False


def test_a_stream_whose_walsender_may_still_hold_the_slot_never_hands_over_to_the_peek(
    tmp_path: Path,
) -> None:
    """Review finding: a hand-over peeked though the stream's walsender might still hold the
    slot (a server refuses that peek; a fake would read beside it). The run fails as retryable,
    the stream's window kept, the slot confirmed there; a run told to stop does not fail."""
    source = _ending_early()
    source.stream_slot = lambda slot, *, start, options, alive=None: _HoldsTheSlot(  # type: ignore[method-assign]
        source, start, dict(options))  # fmt: skip
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180)
    with pytest.raises(SlotStreamError, match="could not be seen to let go of the slot"):
        drain.run(time.monotonic())
    assert _ids(lake) == [1, 2] and source.advances == [LSN(0x1180)]

    from airflow_pglogrepl.pipeline.follow import Follow

    stopped = Follow(window_s=60.0)
    stopped.request_stop()
    again = Drain(source=source, lake=lake, slot="s", publications=["p"],
                  max_window_bytes=0x180, follow=stopped)  # fmt: skip
    assert again.run(time.monotonic()).follow["stopped_by"] == "signal"  # type: ignore[index]


def test_a_following_run_whose_stream_ends_early_follows_on_with_peek_passes(
    tmp_path: Path,
) -> None:
    """A following run hands over as a scheduled one does: passes of the peek for the rest of
    its time, every row once."""
    from airflow_pglogrepl.pipeline.follow import Follow

    source = _ending_early()
    lake = Lake(str(tmp_path / "lake"), "s")
    follow = Follow(window_s=0.05, seconds=60.0)
    advance = source.advance_slot

    def advancing(name: str, upto: LSN | str) -> LSN:
        if LSN(upto) >= source.flush:  # all drained: stopped as a signal stops it
            follow.request_stop()
        return advance(name, upto)

    source.advance_slot = advancing  # type: ignore[method-assign]
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x180, follow=follow).run(time.monotonic())  # fmt: skip
    assert _ids(lake) == [1, 2, 3, 4] and lake.position() == LSN(0x3000)
    assert result.reader_note is not None and "ended early" in result.reader_note
    assert follow.stopped_by == "signal"


def test_a_following_run_opens_its_stream_again_after_it_ended_and_every_row_lands_once(
    tmp_path: Path,
) -> None:
    """Before: a following run whose stream ended peeked for the rest of its life (days), every
    pass decoding again from restart_lsn. Now the stream is opened again after ``reopen_s``."""
    from airflow_pglogrepl.pipeline.follow import Follow

    source = _ending_early()
    follow = Follow(window_s=0.05, seconds=60.0, reopen_s=0.2)
    opened: list[LSN] = []

    def stream_slot(slot: str, *, start: LSN, options: Any, alive: Any = None) -> FakeStream:
        opened.append(start)
        if len(opened) == 1:
            return _EndsEarly(source, start, dict(options))
        follow.request_stop()  # the second stream is the one this test waits for
        return FakeStream(source, start, dict(options))

    source.stream_slot = stream_slot  # type: ignore[method-assign]
    lake = Lake(str(tmp_path / "lake"), "s")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=0x180, follow=follow).run(time.monotonic())  # fmt: skip
    assert _ids(lake) == [1, 2, 3, 4] and lake.position() == LSN(0x3000)
    assert opened == [LSN(0x1000), LSN(0x3000)]  # again from where the peeks left the slot
    assert result.to_dict()["follow"]["stream_reopens"] == 1


def test_a_stream_that_ends_early_and_cannot_be_confirmed_never_hands_over_to_the_peek(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot stays behind the lake (the advance fails too): a peek from there would store
    the stream's window again, so the run stops, as when the decoder declines."""
    source = _ending_early()

    def busy(name: str, upto: object) -> LSN:
        raise SlotInUseError(name, 4242)

    monkeypatch.setattr(source, "advance_slot", busy)
    lake = Lake(str(tmp_path / "lake"), "s")
    with pytest.raises(SlotStreamError, match=r"\(the connection was lost\) before the slot "
                       "could be confirmed at 0/1180"):  # fmt: skip
        Drain(source=source, lake=lake, slot="s", publications=["p"],
              max_window_bytes=0x180).run(time.monotonic())  # fmt: skip
    assert _ids(lake) == [1, 2] and lake.position() == LSN(0x1180)


# -- live: transactions streamed while in progress (streaming 'on') --------------------------


def _small_decoding_memory(src: Source) -> DsnReplicationHook:
    """``src``'s hook whose sessions, the walsender's too, stream every transaction past 64 kB
    (``logical_decoding_work_mem``'s least) instead of keeping it whole."""
    return DsnReplicationHook(_small_memory_dsn(src))


def _small_memory_dsn(src: Source) -> str:
    return f"{src.dsn}?options=-c%20logical_decoding_work_mem%3D64kB"


def _drain(hook: DsnReplicationHook, src: Source, lake_root: str, slot: str,
           reader: str) -> dict[str, Any]:  # fmt: skip
    lake = Lake(lake_root, slot, origins=hook.column_origins)
    with hook.writer_lock(slot) as lock:
        lake.writer_check = lock.check
        drain = Drain(source=hook, lake=lake, slot=slot, publications=[src.publication],
                      max_window_bytes=1 << 16, reader=reader)  # fmt: skip
        return drain.run(time.monotonic()).to_dict()


def _changes(lake_root: str, table: str) -> list[tuple[Any, ...]]:
    rows = changelog(lake_root, TableRef("public", table))
    return sorted((r["_commit_lsn"], r["_seq"], r["_xid"], r["_op"], r["id"]) for r in rows)


def test_transactions_streamed_while_in_progress_land_as_the_peek_lands_them(
    source: Source, tmp_path: Path
) -> None:
    """A transaction far past the walsender's 64 kB, with a sub-transaction rolled back in its
    middle and small transactions committing while it runs, and another rolled back whole: the
    stream has the server send them in blocks, the lake keeps those until the commit, and the
    changelog is the one the peek (which gets each transaction whole) writes, row for row,
    ``_seq`` included."""
    source.sql("CREATE TABLE big (id int PRIMARY KEY, v text)")
    source.sql("CREATE TABLE side (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE big, side")
    peek_slot = f"{source.slot}_peek"
    source.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (peek_slot,))
    fill = "INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(%s::int, %s) g"
    with psycopg.connect(source.dsn) as big, psycopg.connect(source.dsn) as lost:
        big.execute(fill, (1, 2000))
        source.sql("INSERT INTO side VALUES (1)")  # commits while the big one runs
        big.execute("SAVEPOINT s1")
        big.execute(fill, (2001, 3000))
        big.execute("SAVEPOINT s2")
        big.execute(fill, (3001, 3500))
        source.sql("INSERT INTO side VALUES (2)")
        big.execute("ROLLBACK TO SAVEPOINT s1")  # 2001..3500 never happened
        big.execute(fill, (4000, 5999))
        big.execute("UPDATE big SET v = 'y' WHERE id % 500 = 0")
        lost.execute(fill, (10_000, 14_000))
        big.commit()
        lost.rollback()  # streamed, then rolled back whole
    source.sql("INSERT INTO side VALUES (3)")
    hook = _small_decoding_memory(source)
    try:
        streamed = _drain(hook, source, str(tmp_path / "stream"), source.slot, "stream")
        peeked = _drain(hook, source, str(tmp_path / "peek"), peek_slot, "peek")
    finally:
        source.sql("SELECT pg_drop_replication_slot(%s)", (peek_slot,))
    assert streamed["reader"] == "stream" and peeked["reader"] == "peek"
    sent = source.sql("SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s",
                      (source.slot,))  # fmt: skip
    assert sent and sent[0][0] >= 2, "the server streamed no transaction: the test proves nothing"
    for table in ("big", "side"):
        assert _changes(str(tmp_path / "stream"), table) == _changes(str(tmp_path / "peek"), table)
    ids = [r[4] for r in _changes(str(tmp_path / "stream"), "big") if r[3] == "I"]
    assert sorted(ids) == [*range(1, 2001), *range(4000, 6000)]
    assert not any((tmp_path / "stream" / "_pglogrepl" / "in_progress").rglob("*.arrow"))


def test_a_run_killed_while_it_keeps_a_transaction_in_progress_loses_and_repeats_nothing(
    source: Source, tmp_path: Path
) -> None:
    """The application dies (exit 137, nothing cleaned up) after keeping blocks of a streamed
    transaction in the lake. The next run removes them, gets the transaction again from its
    start, and stores each change once."""
    source.sql("CREATE TABLE big (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE big")
    fill = "INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(%s::int, %s) g"
    source.sql(fill, (1, 10))
    source.sql(fill, (11, 5000))  # streamed: far past 64 kB
    source.sql(fill, (5001, 5010))
    lake_root = str(tmp_path / "lake")
    env = {**os.environ, DSN_ENV: _small_memory_dsn(source)}
    command = [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", source.slot,
               "--publication", source.publication, "--lake", lake_root, "--no-materialize",
               "--reader", "stream", "--max-window-bytes", "65536"]  # fmt: skip
    killed = subprocess.run(command, env={**env, FAULT_ENV: "in_progress_kept:2"},
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == 137, killed.stderr[-3000:]
    left = Path(lake_root) / "_pglogrepl" / "in_progress"
    assert any(left.rglob("*.arrow")), "the run died before it kept anything"
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not any(left.rglob("*.arrow"))
    rows = _changes(lake_root, "big")
    assert sorted(r[4] for r in rows) == list(range(1, 5011))  # each once
    position = Lake(lake_root, source.slot).position()
    assert source.hook().get_slot(source.slot).confirmed_flush_lsn == position


# -- live: a transaction the walsender decodes for long without sending anything ---------------


def _silent_source(source: Source) -> None:
    """``source``'s publication: table ``f`` behind a row filter that rejects every row slowly,
    and table ``ok`` without one."""
    create_filtered_publication(source.dsn, source.publication, "f")
    source.sql("CREATE TABLE ok (id int PRIMARY KEY)")
    source.cluster.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE ok").format(
        sql.Identifier(source.publication)), dbname=source.db)  # fmt: skip


def _ok_ids(lake_root: str) -> list[int]:
    return sorted(r["id"] for r in changelog(lake_root, TableRef("public", "ok")))


def test_a_walsender_ended_mid_run_hands_over_to_the_peek_and_the_lake_has_every_row_once(
    source: Source, tmp_path: Path
) -> None:
    """The walsender is terminated while it decodes a transaction that sends nothing, after it
    sent the row before that and before the row after: the run's stream ends with
    SlotStreamError. Before, the run failed; now it peeks on from where the lake and the slot
    agree (the slot is free at once: its walsender is gone) and stores each row once. (A
    transaction left open 8 MiB behind makes "auto" choose the stream.)"""
    _silent_source(source)
    cost_s = decode_cost_s(source.dsn, source.publication, "f", 30)  # (before the pin: see there)
    with restart_lsn_pinned(source, behind=8 << 20):
        _ended_in_the_silence(source, tmp_path, cost_s)


def _ended_in_the_silence(source: Source, tmp_path: Path, cost_s: float) -> None:
    source.sql("INSERT INTO ok VALUES (1)")
    sent_first = source.hook().flush_lsn()
    write_silent_transaction(source.dsn, source.publication, "f", 2.0, pad_bytes=30,
                             cost_s=cost_s)  # fmt: skip
    silent_end = source.hook().flush_lsn()
    source.sql("INSERT INTO ok VALUES (2)")
    source.sql(FILLER, (1 << 20,))  # (more than one peek's span is left: the stream pays)
    ended: list[object] = []

    def end_the_walsender_in_the_silence() -> None:
        try:  # past the first row, not yet past the silent transaction's commit
            (pid,) = wait_until(lambda: source.sql(
                "SELECT r.pid FROM pg_stat_replication r JOIN pg_replication_slots s"
                " ON s.active_pid = r.pid WHERE s.slot_name = %s"
                " AND r.sent_lsn >= %s::pg_lsn AND r.sent_lsn < %s::pg_lsn",
                (source.slot, str(sent_first), str(silent_end))),
                what="the walsender decoding the silent transaction",
            )[0]  # fmt: skip
            ended.append(source.sql("SELECT pg_terminate_backend(%s)", (pid,))[0][0])
        except BaseException as exc:  # raised in the test's thread
            ended.append(exc)

    killer = threading.Thread(target=end_the_walsender_in_the_silence)
    killer.start()
    try:
        result = _drain(source.hook(), source, str(tmp_path / "lake"), source.slot, "auto")
    finally:
        killer.join()
    assert ended == [True], ended
    assert result["reader"] == "stream" and "ended early" in result["reader_note"], result
    assert _ok_ids(str(tmp_path / "lake")) == [1, 2]
    position = Lake(str(tmp_path / "lake"), source.slot).position()
    assert source.hook().get_slot(source.slot).confirmed_flush_lsn == position


def test_a_transaction_decoded_silently_for_longer_than_30_s_is_drained_on_the_first_try(
    source: Source, tmp_path: Path
) -> None:
    """The issue's case, with every default (wal_sender_timeout 60 s, status updates every
    10 s): 45 s of decoding without a message asked for, at least 30 s had (the measured cost
    a row's decoding is sized by can be high by a third on a busy machine). Before, the stream
    gave up after 30 s (three status intervals) on every run, and the lake never passed the
    transaction; now the run streams through it and stores the row after it. (A following run,
    or one behind a pinned restart_lsn, reads with the stream; here it is asked for.)"""
    _silent_source(source)
    write_silent_transaction(source.dsn, source.publication, "f", 45.0, pad_bytes=100)
    source.sql("INSERT INTO ok VALUES (1)")
    began = time.monotonic()
    result = _drain(source.hook(), source, str(tmp_path / "lake"), source.slot, "stream")
    took = time.monotonic() - began
    assert took > 30, f"the decoding took {took:.0f} s, not past the old limit: this proves nothing"
    assert result["reader"] == "stream" and result["reader_note"] is None, result
    assert _ok_ids(str(tmp_path / "lake")) == [1]


def test_a_following_run_whose_walsender_was_ended_streams_again_and_stores_every_row_once(
    source: Source, tmp_path: Path
) -> None:
    """Live: the following stream's walsender is terminated (a dropped connection in a run of
    days). Before, the run peeked for the rest of its life; now it peeks, then streams again
    from where the lake is, and every row lands once."""
    from airflow_pglogrepl.pipeline.follow import Follow

    source.sql("CREATE TABLE ok (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE ok")
    hook, lake_root = source.hook(), str(tmp_path / "lake")
    follow = Follow(window_s=0.2, seconds=120.0, reopen_s=0.5)
    outcome: list[Any] = []

    def follow_the_slot() -> None:
        lake = Lake(lake_root, source.slot, origins=hook.column_origins)
        try:
            with hook.writer_lock(source.slot) as lock:
                lake.writer_check = lock.check
                outcome.append(Drain(source=hook, lake=lake, slot=source.slot,
                                     publications=[source.publication], max_window_bytes=1 << 16,
                                     follow=follow).run(time.monotonic()))  # fmt: skip
        except BaseException as exc:  # raised in the test's thread
            outcome.append(exc)

    def walsender() -> int | None:
        rows = source.sql("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                          (source.slot,))  # fmt: skip
        return rows[0][0] if rows else None

    runner = threading.Thread(target=follow_the_slot)
    runner.start()
    try:
        source.sql("INSERT INTO ok VALUES (1)")
        wait_until(lambda: _ok_ids(lake_root) == [1], what="row 1 in the lake")
        first = wait_until(walsender, what="the stream's walsender")
        assert source.sql("SELECT pg_terminate_backend(%s)", (first,)) == [(True,)]
        source.sql("INSERT INTO ok VALUES (2)")
        wait_until(lambda: _ok_ids(lake_root) == [1, 2], what="row 2 in the lake")
        second = wait_until(lambda: (pid := walsender()) not in (None, first) and pid,
                            what="a new walsender: the stream opened again")  # fmt: skip
        source.sql("INSERT INTO ok VALUES (3)")
        wait_until(lambda: _ok_ids(lake_root) == [1, 2, 3], what="row 3 in the lake")
        assert walsender() == second  # row 3 came through the stream opened again
    finally:
        follow.request_stop()
        runner.join(timeout=120)
    (result,) = outcome
    assert not isinstance(result, BaseException), result
    assert result.to_dict()["follow"]["stream_reopens"] >= 1
    assert "ended early" in (result.reader_note or "")
    assert _ok_ids(lake_root) == [1, 2, 3]


def test_a_following_run_whose_stream_was_refused_does_not_ask_again(tmp_path: Path) -> None:
    """Review finding: a refused stream (a role without REPLICATION) was asked for again every
    reopen for the life of the run, each a failed login in the server's log."""
    from airflow_pglogrepl.exceptions import SlotStreamUnavailableError
    from airflow_pglogrepl.pipeline.follow import Follow

    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x3000)
    asked: list[LSN] = []

    def refused(slot: str, *, start: LSN, options: Any, alive: Any = None) -> FakeStream:
        asked.append(start)
        raise SlotStreamUnavailableError(slot, "the role may not replicate")

    source.stream_slot = refused  # type: ignore[method-assign]
    follow = Follow(window_s=0.05, seconds=1.0, reopen_s=0.05)
    drain = Drain(source=source, lake=Lake(str(tmp_path / "lake"), "s"), slot="s",
                  publications=["p"], max_window_bytes=0x180, follow=follow)  # fmt: skip
    result = drain.run(time.monotonic())
    assert asked == [LSN(0x1000)]
    assert result.to_dict()["follow"]["stream_reopens"] == 0
    with pytest.raises(ValueError, match="positive number of seconds"):
        Follow(window_s=1.0, reopen_s=0)
