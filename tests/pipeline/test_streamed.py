"""Reading the slot through the stream: when a run streams, falls back to the peek or refuses,
how its windows are confirmed through unpublished traffic, and how its end hands over to the
peek (a fake walsender, ``tests.support.fake_source.FakeStream``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from airflow_pglogrepl.faults import FAULT_ENV
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.spark.app import DSN_ENV
from airflow_pglogrepl.tables import TableRef
from tests.pipeline.test_windows import _ids, three_transactions
from tests.support.drain import changelog
from tests.support.fake_source import FakeSource
from tests.support.sources import Source


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
                   max_window_bytes=0x1000).run(time.monotonic())  # fmt: skip
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
