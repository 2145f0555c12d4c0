"""The per-message path's windows (``message_windows``): a table whose changes cannot be stored
goes to the lake's quarantine and the window is read again without it, every other table
committed; with the quarantine off the run stops on it and nothing of the window counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import UnstorableValueError
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.quarantine import TABLE_ERRORS
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.committer import WindowCommitter
from airflow_pglogrepl.pipeline.message_windows import MessageWindows
from airflow_pglogrepl.pipeline.readers import peek_options
from airflow_pglogrepl.tables import TableRef
from tests.support.fake_source import FakeSource
from tests.support.pgoutput_encoder import Session, relation

INT8, TEXT = 20, 25


def _session() -> Session:
    session = Session(start=0x1000)
    session.add(relation(16384, "good", [("id", INT8, True)]))
    session.add(relation(16385, "bad", [("id", INT8, True), ("name", TEXT)]))
    session.begin(700, 0x1100).insert(16384, b"1").insert(16385, b"2", b"x").commit(0x1100, 0x1108)
    return session


def _windows(tmp_path: Path, *, quarantine: bool) -> tuple[MessageWindows, FakeSource]:
    source = FakeSource(_session().rows, confirmed=0x1000, flush=0x2000)
    committer = WindowCommitter(source=source, lake=Lake(str(tmp_path / "lake"), "s"), slot="s",
                                publications=["p"], batch_rows=10)  # fmt: skip
    return MessageWindows(committer, peek_options(["p"]), held={},
                          quarantine=quarantine), source  # fmt: skip


def _refuse_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lake refuses the table ``bad``'s rows, as it refuses a value it cannot store."""
    from airflow_pglogrepl.lake.window import Window

    write = Window.write

    def refusing(self: Window, table: TableRef, batch: object) -> int:
        if table.name == "bad":
            raise UnstorableValueError(str(table), "name", "x", "a value the lake cannot hold")
        return write(self, table, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(Window, "write", refusing)


@pytest.mark.unit
def test_a_table_that_cannot_be_stored_is_held_and_the_others_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_bad(monkeypatch)
    windows, source = _windows(tmp_path, quarantine=True)
    stats = windows.window(LSN(0x1000), LSN(0x2000), next_commit=False)
    assert set(windows.held) == {TableRef("public", "bad")}
    assert stats.tables == {"public.good": 1} and stats.quarantined == {"public.bad": 1}
    assert source.advances == [LSN(0x2000)]


@pytest.mark.unit
def test_without_the_quarantine_the_window_stops_on_the_table_and_nothing_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_bad(monkeypatch)
    windows, source = _windows(tmp_path, quarantine=False)
    with pytest.raises(TABLE_ERRORS):
        windows.window(LSN(0x1000), LSN(0x2000), next_commit=False)
    assert windows.held == {} and source.advances == []
    assert windows.committer.lake.position() is None


@pytest.mark.unit
@pytest.mark.parametrize("queue_bytes", [1 << 30, 1])
def test_rows_are_written_once_their_messages_fill_the_queue_and_fetched_in_small_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queue_bytes: int
) -> None:
    """A transaction of wide rows bigger than a window is neither fetched nor held whole:
    the peek's rows come ``FETCH_ROWS`` at a time, and a window writes its rows once the
    messages read since the last write hold ``QUEUE_BYTES`` (a 700 MiB transaction peaked at
    2.6 GiB, fetched and queued by ``batch_rows``, 200,000 rows)."""
    from deltalake import DeltaTable

    from airflow_pglogrepl.pipeline import message_windows

    monkeypatch.setattr(message_windows, "QUEUE_BYTES", queue_bytes)
    session = Session(start=0x1000)
    session.add(relation(16384, "good", [("id", INT8, True)]))
    session.begin(700, 0x1100).insert(16384, b"1").insert(16384, b"2").insert(16384, b"3")
    session.commit(0x1100, 0x1108)
    source = FakeSource(session.rows, confirmed=0x1000, flush=0x2000)
    fetched: list[int] = []
    peek = source.peek_changes

    def recording(slot: str, **options: object) -> object:
        fetched.append(int(options["batch_rows"]))  # type: ignore[call-overload]
        return peek(slot, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(source, "peek_changes", recording)
    lake = Lake(str(tmp_path / "lake"), "s")
    committer = WindowCommitter(source=source, lake=lake, slot="s", publications=["p"],
                                batch_rows=200_000)  # fmt: skip
    windows = MessageWindows(committer, peek_options(["p"]), held={}, quarantine=False)
    stats = windows.window(LSN(0x1000), LSN(0x2000), next_commit=False)
    assert stats.tables == {"public.good": 3}
    files = len(DeltaTable(lake.paths.changes(TableRef("public", "good"))).file_uris())
    assert files == (1 if queue_bytes > 1 else 3)
    assert fetched == [message_windows.FETCH_ROWS]
