"""A following run (``--follow``): its bounds and stop switch, its freshness histogram, the drain
loop following a fake stream, and the application following a live slot until a signal."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from airflow_pglogrepl.lake.delta import read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.committer import WindowCommitter
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.pipeline.follow import Follow, Freshness, freshness_of
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.drain import changelog, start_drain_app
from tests.support.fake_source import FakeSource
from tests.support.pgoutput_encoder import Session, relation
from tests.support.sources import Source

INT8, TEXT = 20, 25


@pytest.mark.unit
def test_freshness_percentiles_are_of_transactions_to_the_histograms_resolution() -> None:
    fresh = Freshness()
    assert fresh.to_dict() == {"transactions": 0, "p50_s": None, "p99_s": None, "max_s": None}
    fresh.add(np.array([0.104] * 98 + [2.5, 700.0]))
    assert fresh.to_dict() == {"transactions": 100, "p50_s": 0.11, "p99_s": 2.51, "max_s": 700.0}
    fresh.add(np.array([-0.3]))  # a source clock ahead of ours: counted as readable at once
    assert fresh.transactions == 101 and fresh.percentile(0.5) == 0.01


@pytest.mark.unit
def test_freshness_of_commit_times_is_seconds_to_the_moment_they_became_readable() -> None:
    times = np.array(["2026-01-01T00:00:00", "2026-01-01T00:00:01.5"], dtype="datetime64[us]")
    readable = float(np.datetime64("2026-01-01T00:00:02", "s").astype(np.int64))
    assert freshness_of(times, readable).tolist() == [2.0, 0.5]


@pytest.mark.unit
def test_a_follow_ends_on_its_stop_its_time_or_its_windows_and_says_which() -> None:
    follow = Follow(window_s=1.0)
    assert not follow.over() and follow.stopped_by is None
    follow.request_stop()
    assert follow.over() and follow.to_dict()["stopped_by"] == "signal"
    timed = Follow(window_s=1.0, seconds=5.0, began=time.monotonic() - 5.0)
    assert timed.over() and timed.stopped_by == "time"
    counted = Follow(window_s=1.0, max_windows=2)
    counted.windows = 2
    assert counted.over() and counted.stopped_by == "windows"
    for bad in ({"window_s": 0.0}, {"window_s": float("nan")}, {"window_s": 1.0, "seconds": -1}):
        with pytest.raises(ValueError, match="positive number of seconds"):
            Follow(**bad)


def three_transactions() -> Session:
    session = Session(start=0x1000)
    items = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    session.add(items).begin(700, 0x1100).insert(16384, b"1", b"one").insert(16384, b"2", b"two")
    session.commit(0x1100, 0x1108)
    session.begin(701, 0x1200).insert(16384, b"3", b"three").commit(0x1200, 0x1208)
    session.begin(702, 0x1300).insert(16384, b"4", b"four").commit(0x1300, 0x1308)
    return session


def slow_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows that take a while to open: the following run's clock moves on."""
    opened = WindowCommitter.open

    def open_slowly(self: WindowCommitter, start: LSN) -> Any:
        time.sleep(0.02)  # the cost of a commit, not a synchronisation
        return opened(self, start)

    monkeypatch.setattr(WindowCommitter, "open", open_slowly)


@pytest.mark.unit
def test_a_following_run_commits_on_its_clock_at_what_the_server_sent_then_ends_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake server sends two messages a batch, so transactions span batches, then keeps
    quiet. With a window every few milliseconds, windows are cut at batch ends, never inside a
    transaction (a window whose rows commit past its end is refused); the run ends once it has
    committed its two windows and read the transaction in hand whole, every change stored once
    and the slot confirmed there."""
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x1400)
    source.streams = True
    lake = Lake(str(tmp_path / "lake"), "s")
    follow = Follow(window_s=0.001, max_windows=2)
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"],
                  max_window_bytes=1 << 20, follow=follow)  # fmt: skip
    slow_windows(monkeypatch)
    result = drain.run(time.monotonic()).to_dict()
    assert result["reader"] == "stream" and result["windows"] >= 2
    assert result["follow"]["stopped_by"] == "windows"
    assert result["follow"]["freshness"]["transactions"] == result["transactions"]
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    ids = sorted(r["id"] for r in rows)
    assert ids == sorted(set(ids)) and len(ids) == result["changes"] > 0
    assert lake.position() == source.slot.confirmed_flush_lsn == LSN(result["window_end_lsn"])
    commits = {r["_commit_lsn"] for r in rows}
    assert all(c < int(lake.position() or 0) for c in commits)


@pytest.mark.unit
def test_a_following_run_stopped_while_quiet_commits_what_it_holds_and_no_empty_window(
    tmp_path: Path,
) -> None:
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x1400)
    source.streams = True
    source.batch_messages = 100  # everything in one batch, then quiet
    lake = Lake(str(tmp_path / "lake"), "s")
    follow = Follow(window_s=3600.0)  # the clock never cuts: only the stop does

    drain = Drain(source=source, lake=lake, slot="s", publications=["p"],
                  max_window_bytes=1 << 20, follow=follow)  # fmt: skip
    original = source.stream_slot

    def stream_then_stop(*args: Any, **kwargs: Any) -> Any:
        stream = original(*args, **kwargs)
        batches = stream.batches_or_idle

        def stopping(idle_s: float | None) -> Any:
            for batch in batches(idle_s):
                if batch is None:
                    follow.request_stop()  # as the signal handler does, while nothing comes
                yield batch

        stream.batches_or_idle = stopping
        return stream

    source.stream_slot = stream_then_stop  # type: ignore[method-assign]
    result = drain.run(time.monotonic()).to_dict()
    assert result["follow"]["stopped_by"] == "signal" and result["windows"] == 1
    assert result["changes"] == 4 and result["transactions"] == 3
    assert lake.position() == source.slot.confirmed_flush_lsn == LSN(0x1400)


@pytest.mark.unit
def test_a_following_run_that_may_only_peek_drains_in_passes_until_its_time(
    tmp_path: Path,
) -> None:
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x1400)
    lake = Lake(str(tmp_path / "lake"), "s")
    # (its time counts from the start: the first run in a process spends about a second
    # loading the columnar path's libraries before it reads)
    follow = Follow(window_s=0.05, seconds=2.0)
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"],
                  max_window_bytes=1 << 20, follow=follow)  # fmt: skip
    result = drain.run(time.monotonic()).to_dict()
    # measured from the follow's own start (made before the drain; a clock started after it
    # read 1.9997 s in CI)
    assert 2.0 <= time.monotonic() - follow.began < 8.0
    assert result["reader"] == "peek" and "refused" in (result["reader_note"] or "")
    assert result["follow"]["stopped_by"] == "time" and result["changes"] == 4
    assert lake.position() == source.slot.confirmed_flush_lsn == LSN(0x1400)


# -- live: the application follows a slot ----------------------------------------------------


def lake_ids(lake_root: str) -> list[int]:
    try:
        return sorted(r["id"] for r in changelog(lake_root, TableRef("public", "f")))
    except Exception:  # the table is not in the lake yet
        return []


@pytest.mark.parametrize("reader", ["stream", "peek"])
def test_the_application_follows_until_sigterm_then_ends_well_with_all_committed(
    source: Source, tmp_path: Path, reader: str
) -> None:
    """Rows become readable in changes/ while the run goes on, window after window; SIGTERM
    then ends it with exit 0, its summary saying so, the slot confirmed at the lake's
    position and every row there once."""
    lake_root = str(tmp_path / "lake")
    result = follow_then_stop(source, lake_root, lake_ids, 3, "--no-materialize", "--reader",
                              reader)  # fmt: skip
    assert result["follow"]["stopped_by"] == "signal" and result["reader"] == reader
    assert result["windows"] >= 3 and result["changes"] == 30
    assert lake_ids(lake_root) == list(range(30))
    position = Lake(lake_root, source.slot).position()
    assert source.hook().get_slot(source.slot).confirmed_flush_lsn == position
    if reader == "stream":
        fresh = result["follow"]["freshness"]
        assert fresh["transactions"] == 3 and fresh["max_s"] is not None


@pytest.mark.unit
def test_a_following_run_that_folds_its_windows_still_counts_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_pglogrepl.pipeline import results

    monkeypatch.setattr(results, "FOLD_AT", 1)
    source = FakeSource(three_transactions().rows, confirmed=0x1000, flush=0x1400)
    source.streams = True
    lake = Lake(str(tmp_path / "lake"), "s")
    slow_windows(monkeypatch)
    follow = Follow(window_s=0.001, max_windows=3)
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"],
                  max_window_bytes=1 << 20, follow=follow)  # fmt: skip
    run = drain.run(time.monotonic())
    result = run.to_dict()
    assert len(run.windows) <= 2 < result["windows"] == follow.windows == len(lake.windows())
    assert result["changes"] == sum(
        len(changelog_ids)
        for changelog_ids in [
            read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
        ]
    )


@pytest.mark.unit
def test_a_follow_merges_on_its_clock_and_counts_what_each_merge_made_readable() -> None:
    merged: list[float] = []
    follow = Follow(window_s=1.0, merge_s=0.05, merge=lambda: merged.append(time.monotonic()))
    now = np.datetime64(int(time.time() * 1e6), "us")
    follow.committed(np.array([now, now]), time.time())
    follow.after_window()  # too soon after the start
    assert merged == [] and follow.windows == 1
    wait_until(lambda: time.monotonic() - follow._merged_at >= 0.05, what="merge_s to pass")
    follow.after_window()
    assert len(merged) == 1 and follow.state_freshness.transactions == 2
    follow.merge_now()  # nothing new: a merge, nothing counted
    summary = follow.to_dict()
    assert summary["merges"] == 2 and summary["merge_s"] == 0.05
    assert summary["state_freshness"]["transactions"] == 2
    assert Follow(window_s=1.0).to_dict()["merge_s"] is None  # (no merge while following)
    with pytest.raises(ValueError, match="between merges"):
        Follow(window_s=1.0, merge_s=0)


def test_a_bursts_last_window_is_merged_while_nothing_more_comes() -> None:
    """The last window of a burst committed just after a merge: no window after it comes to
    merge it, so the quiet itself does, once ``merge_s`` passed (a test of a following run
    waited 120 s for rows no merge brought)."""
    merged: list[float] = []
    follow = Follow(window_s=1.0, merge_s=0.05, merge=lambda: merged.append(time.monotonic()))
    follow.merge_if_due()  # nothing committed: no merge however long it is quiet
    now = np.datetime64(int(time.time() * 1e6), "us")
    follow.committed(np.array([now]), time.time())
    follow.after_window()  # too soon after the last merge (the start)
    follow.merge_if_due()
    assert merged == []
    wait_until(lambda: time.monotonic() - follow._merged_at >= 0.05, what="merge_s to pass")
    follow.merge_if_due()
    assert len(merged) == 1 and follow.state_freshness.transactions == 1
    follow.merge_if_due()  # merged already: none again
    assert len(merged) == 1


def test_a_following_run_merges_the_state_while_it_follows(source: Source, tmp_path: Path) -> None:
    """``state/`` becomes readable while the run goes on, not only at its end, and the summary
    says how fresh it was."""
    lake_root = str(tmp_path / "lake")
    follow = follow_then_stop(source, lake_root, state_ids, 2, "--merge-seconds", "0.5")["follow"]
    assert follow["merges"] >= 2 and follow["state_freshness"]["transactions"] == 2, follow
    assert follow["state_freshness"]["p99_s"] < 60, follow


def state_ids(lake_root: str) -> list[int]:
    from airflow_pglogrepl.lake.delta import open_table

    uri = f"{lake_root}/state/public.f"
    if open_table(uri) is None:
        return []
    return sorted(r["id"] for r in read_table(uri).to_pylist())


def follow_then_stop(source: Source, lake_root: str, readable: Any, steps: int,
                     *args: str) -> dict[str, Any]:  # fmt: skip
    """A following application on a new published table ``f``: ``steps`` inserts of ten rows,
    each waited for until ``readable(lake_root)`` shows it while the run goes on, then SIGTERM;
    its summary (it must end with exit 0)."""
    import json

    source.sql("CREATE TABLE f (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE f")
    run = start_drain_app(source, lake_root, "--follow", "--window-seconds", "0.2", *args)
    try:
        for step in range(steps):
            source.sql("INSERT INTO f SELECT g, 'x' FROM generate_series(%s::int, %s) g",
                       (step * 10, step * 10 + 9))  # fmt: skip
            wait_until(lambda n=step: readable(lake_root)[-1:] == [n * 10 + 9],
                       what=f"rows of step {step} readable while the run follows",
                       timeout=120)  # fmt: skip
        assert run.poll() is None, run.communicate()[1][-3000:]
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result
