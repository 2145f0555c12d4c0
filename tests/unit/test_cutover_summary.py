"""The cutover summary: outcome and write downtime from the tasks' return values."""

from __future__ import annotations

from airflow_pglogrepl.operators.summary import NOT_FENCED, ROLLED_BACK, SWITCHED, summarize

FENCE = {
    "fence_lsn": "0/3000060",
    "write_fence_at": "2026-11-25T04:00:00.250000+00:00",
    "waited_seconds": 2.0,
    "server_version": "15.14",
}
FINALIZE = {
    "dropped": True,
    "switched_at": "2026-11-25T04:00:07.750000+00:00",
    "server_version": "18.6",
    "slot_left_behind": None,
}


def test_a_switch_reports_the_downtime_from_fence_to_switch() -> None:
    report = summarize(
        fence=FENCE, finalize=FINALIZE, parity={"passed": True, "checked": 2},
        sequences={"changed": 3},
    )  # fmt: skip
    assert report["outcome"] == SWITCHED
    assert report["write_downtime_seconds"] == 7.5
    assert (report["old_primary_version"], report["new_primary_version"]) == ("15.14", "18.6")
    assert report["parity_passed"] is True and report["sequences_changed"] == 3
    assert "PostgreSQL 15.14 -> 18.6: switched" in report["text"]
    assert "write downtime       7.5 s" in report["text"]


def test_a_fence_without_a_switch_is_a_rollback_without_downtime_figure() -> None:
    report = summarize(fence=FENCE, finalize=None, parity={"passed": False, "checked": 2})
    assert report["outcome"] == ROLLED_BACK
    assert report["write_downtime_seconds"] is None
    assert "DIFFERENT on 2 tables" in report["text"]


def test_no_fence_means_the_application_never_stopped() -> None:
    report = summarize(fence=None, finalize=None)
    assert report["outcome"] == NOT_FENCED and report["fence_lsn"] is None


def test_a_slot_left_behind_is_named_with_its_drop() -> None:
    report = summarize(fence=FENCE, finalize={**FINALIZE, "slot_left_behind": "sub_slot"})
    assert "SELECT pg_drop_replication_slot('sub_slot')" in report["text"]
