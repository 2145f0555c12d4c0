"""A drain run's account: the summary sums its windows (changes, transactions, tables, the
quarantine's changes per held table), says where it started and ended, and still reads right for
a run with no window at all."""

from __future__ import annotations

import logging

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.results import DrainResult, WindowStats, log_window, peak_rss_mb


def _result(windows: list[WindowStats], **extra: object) -> DrainResult:
    return DrainResult(slot="s", windows=windows, confirmed_before=LSN(0x100),
                       confirmed_after=LSN(0x300), run_end=LSN(0x400), startup_s=1.23456,
                       lag_bytes_left=0x100, **extra)  # type: ignore[arg-type]  # fmt: skip


def test_the_summary_sums_the_windows_and_names_the_first_start_and_last_end() -> None:
    windows = [
        WindowStats(LSN(0x100), LSN(0x200), transactions=2, changes=5, seconds=0.5,
                    tables={"public.a": 3, "public.b": 2}, quarantined={"public.c": 4}),
        WindowStats(LSN(0x200), LSN(0x300), transactions=1, changes=3, seconds=0.5,
                    tables={"public.a": 3}, decoder="columnar"),
    ]  # fmt: skip
    cause = {"error": "UnstorableValueError", "since": "0/100"}
    summary = _result(windows, quarantined={"public.c": cause}).to_dict()
    assert summary["windows"] == 2 and summary["columnar_windows"] == 1
    assert (summary["window_start_lsn"], summary["window_end_lsn"]) == ("0/100", "0/300")
    assert (summary["transactions"], summary["changes"], summary["wal_bytes"]) == (3, 8, 0x200)
    assert summary["tables"] == {"public.a": 6, "public.b": 2}
    assert summary["changes_per_s"] == 8.0 and summary["startup_s"] == 1.235
    assert summary["quarantined"] == {"public.c": {**cause, "changes": 4}}
    assert summary["confirmed_flush_lsn_before"] == "0/100"
    assert summary["confirmed_flush_lsn_after"] == "0/300"


def test_a_run_without_windows_stands_where_the_slot_stands() -> None:
    summary = _result([]).to_dict()
    assert summary["windows"] == 0 and summary["changes"] == 0 and summary["wal_bytes"] == 0
    assert summary["window_start_lsn"] == summary["window_end_lsn"] == "0/300"
    assert summary["changes_per_s"] == 0.0 and summary["tables"] == {}
    empty = DrainResult(slot="s", windows=[], confirmed_before=None, confirmed_after=None,
                        run_end=LSN(0), startup_s=0.0, lag_bytes_left=0).to_dict()  # fmt: skip
    assert empty["confirmed_flush_lsn_before"] is None and empty["window_start_lsn"] is None


def test_each_window_is_one_log_line_with_its_bounds_path_and_lag_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = WindowStats(LSN(0x100), LSN(0x200), transactions=2, changes=5, seconds=0.25,
                        decoder="columnar")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="airflow_pglogrepl.drain"):
        log_window(stats, LSN(0x1200))
    assert caplog.messages == [
        "window 0/100..0/200 (columnar): 2 transactions, 5 changes, 256 WAL bytes, 0.25s, "
        "lag left 4096"
    ]


def test_peak_memory_is_this_processes_in_mebibytes() -> None:
    assert 1 < peak_rss_mb() < 1 << 20


@pytest.mark.unit
def test_a_following_runs_older_windows_fold_into_one_record_that_counts_for_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of days keeps a bounded record: past ``FOLD_AT``, all but the last window become
    one, and the summary still counts every window, change and table."""
    from airflow_pglogrepl.pipeline import results

    monkeypatch.setattr(results, "FOLD_AT", 3)
    windows = [
        results.WindowStats(start=LSN(10 * i), end=LSN(10 * i + 10), transactions=1, changes=2,
                            seconds=0.5, tables={"public.t": 2}, decoder="columnar")
        for i in range(5)
    ]  # fmt: skip
    before = results.DrainResult(slot="s", windows=list(windows), confirmed_before=LSN(0),
                                 confirmed_after=LSN(50), run_end=LSN(50), startup_s=0.0,
                                 lag_bytes_left=0).to_dict()  # fmt: skip
    results.fold_older(windows)
    assert len(windows) == 2 and windows[0].count == 4 and windows[-1].start == LSN(40)
    assert (windows[0].start, windows[0].end) == (LSN(0), LSN(40))
    after = results.DrainResult(slot="s", windows=windows, confirmed_before=LSN(0),
                                confirmed_after=LSN(50), run_end=LSN(50), startup_s=0.0,
                                lag_bytes_left=0).to_dict()  # fmt: skip
    keys = ("windows", "columnar_windows", "changes", "transactions", "tables", "wal_bytes",
            "window_start_lsn", "window_end_lsn", "changes_per_s")  # fmt: skip
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
    assert after["windows"] == 5
