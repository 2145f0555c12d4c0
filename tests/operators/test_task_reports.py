"""The closing paragraph of a drain or snapshot task, from the summary the application returns."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.operators.task_reports import drain_paragraph, snapshot_paragraph

pytestmark = pytest.mark.unit

DRAINED = {
    "slot": "lake_shop", "windows": 3, "transactions": 15, "changes": 3000, "wal_bytes": 504832,
    "confirmed_flush_lsn_before": "0/1A10200", "confirmed_flush_lsn_after": "0/1A8B600",
    "tables": {f"public.t{i}": 100 * (i + 1) for i in range(7)}, "lag_bytes_left": 0,
    "materialized": {"public.t0": "0/1A8B600"}, "materialize_s": 0.42, "spark_start_s": None,
    "idle": False,
}  # fmt: skip


def test_a_drain_says_how_much_between_which_lsns_and_where() -> None:
    text = drain_paragraph(DRAINED, lake_root="/data/lake")
    assert text.startswith("Drain of slot lake_shop into /data/lake: 3,000 changes in 15 ")
    assert "0/1A10200 -> 0/1A8B600 (493.0 KiB of WAL)" in text
    # the five busiest tables, then a count of the others
    assert "public.t6 700, public.t5 600, public.t4 500, public.t3 400, public.t2 300 and 2 more"
    assert "and 2 more" in text and "public.t0 100" not in text
    assert "Merged 1 tables into state/ in 0.4 s (no Spark started)." in text
    assert "next run" not in text


def test_a_drain_that_stopped_short_says_what_is_left_and_that_spark_started() -> None:
    text = drain_paragraph(
        {**DRAINED, "lag_bytes_left": 3 * 1024 * 1024, "spark_start_s": 7.25}, lake_root="s3a://b/l"
    )
    assert "(Spark started in 7.2 s)" in text
    assert "3.0 MiB of WAL were past this run's end: the next run drains them." in text


def test_a_drain_with_tables_in_quarantine_names_them_and_the_fix() -> None:
    held = {"public.t3": {"error": "UnstorableValueError", "what": "column 'at': too late",
                          "since": "0/1A10200", "changes": 2}}  # fmt: skip
    text = drain_paragraph({**DRAINED, "quarantined": held}, lake_root="/data/lake")
    assert (
        "In quarantine, their changes kept in /data/lake/_pglogrepl/quarantine: public.t3 " in text
    )
    assert "(UnstorableValueError: column 'at': too late; 2 changes this run)" in text
    assert "re-snapshot them" in text
    assert "quarantine" not in drain_paragraph(DRAINED, lake_root="/data/lake")


def test_an_idle_drain_says_nothing_was_started() -> None:
    idle = {**DRAINED, "idle": True, "windows": 0, "changes": 0, "lag_bytes_left": 56}
    text = drain_paragraph(idle, lake_root="/data/lake")
    assert "nothing to do, no Spark started" in text and "56 bytes of WAL" in text


def test_a_snapshot_says_rows_tables_and_its_point() -> None:
    taken = {"slot": "s", "status": "committed", "rows": 12345, "consistent_point": "0/10",
             "tables": {"public.a": {}, "public.b": {}}}  # fmt: skip
    assert snapshot_paragraph(taken, lake_root="/l") == (
        "Snapshot of slot s into /l: 12,345 rows of 2 tables, committed at 0/10."
    )
    assert "already holds it (at 0/10)" in snapshot_paragraph(
        {"slot": "s", "status": "exists", "consistent_point": "0/10"}, lake_root="/l"
    )
