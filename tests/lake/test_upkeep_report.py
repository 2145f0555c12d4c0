"""What the upkeep reports: a table it changed nothing on is a DEBUG line unless its line says
what to set or run; a table that rested (no commit since its last upkeep) is a DEBUG line too.
Which tables rest is tested on real lakes in tests/lake/test_upkeep.py."""

from __future__ import annotations

import logging

import pytest

from airflow_pglogrepl.lake.upkeep_report import TableReport, rest, summary, upkeep_level


@pytest.mark.parametrize(
    "advice",
    [
        "log cleanup: it would leave the log readable from version 9 only, and version 2 holds "
        "the kept position; set a longer delta.logRetentionDuration on state/public.a (now 2 "
        "hours) or keep less",
        "purge: 3 files keep deletion vectors (too big or alone to be packed without a JVM); "
        "purge them with Spark: REORG TABLE delta.`/lake/state/public.a` APPLY (PURGE)",
        "vacuum: the log no longer dates version 4",
    ],
)
def test_a_table_left_as_it_was_with_advice_is_a_line_of_the_task_log(advice: str) -> None:
    """A table the upkeep changed nothing on, but whose line says what to set or run (or that
    VACUUM could not run): that line is no DEBUG line."""
    routine = [
        "compaction: below every threshold",
        "checkpoint: 4 versions since the last one (every 10)",
    ]
    quiet = TableReport("state/public.a", version_before=7, version_after=7, skipped=routine)
    assert upkeep_level(quiet) == logging.DEBUG
    advised = TableReport("state/public.a", version_before=7, version_after=7,
                          skipped=[*routine, advice])  # fmt: skip
    assert upkeep_level(advised) == logging.INFO
    noted = TableReport("state/public.a", version_before=7, version_after=7, skipped=routine,
                        notes=["the log no longer reaches 0/1E: kept from version 3"])  # fmt: skip
    assert upkeep_level(noted) == logging.INFO


def test_a_rested_table_is_a_debug_line_that_says_since_when() -> None:
    rested = rest("changes/public.a", {"version": 12, "upkeep_at": 0.0})
    assert rested.version_before == rested.version_after == 12
    assert upkeep_level(rested) == logging.DEBUG
    assert "no commit since the last upkeep at 1970-01-01 00:00:00 UTC (version 12)" in summary(
        rested
    )
