"""The cutover summary: outcome and write downtime from what the tasks pushed."""

from __future__ import annotations

from airflow_pglogrepl.operators.summary import (
    FENCE_HELD,
    NOT_FENCED,
    ROLLED_BACK,
    SWITCH_INCOMPLETE,
    SWITCHED,
    summarize,
)

APPLIED = {"write_fence_at": "2026-11-25T04:00:00.250000+00:00", "server_version": "15.14"}
DROPPED = {"dropped_at": "2026-11-25T04:00:07.500000+00:00"}
FENCE = {"fence_lsn": "0/3000060", "waited_seconds": 2.0}
FINALIZE = {
    "dropped": True,
    "switched_at": "2026-11-25T04:00:07.750000+00:00",
    "server_version": "18.6",
    "slot_left_behind": None,
}


def test_a_switch_reports_the_downtime_from_fence_to_switch() -> None:
    report = summarize(
        fence_applied=APPLIED, dropped=DROPPED, finalize=FINALIZE, fence=FENCE,
        parity={"passed": True, "checked": 2}, sequences={"changed": 3},
    )  # fmt: skip
    assert report["outcome"] == SWITCHED and report["next_step"] is None
    assert report["write_downtime_seconds"] == 7.5
    assert (report["old_primary_version"], report["new_primary_version"]) == ("15.14", "18.6")
    assert report["parity_passed"] is True and report["sequences_changed"] == 3
    assert "PostgreSQL 15.14 -> 18.6: switched" in report["text"]
    assert "write downtime       7.5 s" in report["text"]


def test_a_finalize_that_failed_after_the_drop_is_not_taken_for_a_rerun() -> None:
    """The subscription is gone: triggering the DAG again would copy the tables anew."""
    report = summarize(fence_applied=APPLIED, dropped=DROPPED, finalize=None, released=None)
    assert report["outcome"] == SWITCH_INCOMPLETE
    assert "do NOT trigger the DAG again" in report["next_step"]
    assert report["write_downtime_seconds"] is None


def test_a_finalize_retried_after_the_drop_switched_without_a_figure() -> None:
    retried = {"dropped": False, "already_dropped": True, "server_version": "18.6"}
    report = summarize(fence_applied=APPLIED, dropped=None, finalize=retried)
    assert report["outcome"] == SWITCHED and report["write_downtime_seconds"] is None
    assert "unknown: finalize was retried" in report["text"]


def test_a_released_fence_is_a_rollback_and_a_held_one_says_so() -> None:
    rolled = summarize(fence_applied=APPLIED, dropped=None, finalize=None,
                       released={"roles_released": ["app"]},
                       parity={"passed": False, "checked": 2})  # fmt: skip
    assert rolled["outcome"] == ROLLED_BACK and "trigger the DAG again" in rolled["next_step"]
    assert "DIFFERENT on 2 tables" in rolled["text"]
    held = summarize(fence_applied=APPLIED, dropped=None, finalize=None, released=None)
    assert held["outcome"] == FENCE_HELD and "WriteFenceReleaseOperator" in held["next_step"]


def test_a_fence_that_failed_after_taking_effect_still_counts_as_fenced() -> None:
    """The fence's return value is missing (it failed after applying), its mark is not."""
    report = summarize(fence_applied=APPLIED, dropped=None, finalize=None, fence=None,
                       released={"roles_released": ["app"]})  # fmt: skip
    assert report["outcome"] == ROLLED_BACK


def test_no_fence_means_the_application_never_stopped() -> None:
    report = summarize(fence_applied=None, dropped=None, finalize=None)
    assert report["outcome"] == NOT_FENCED and report["fence_lsn"] is None


def test_a_slot_left_behind_is_named_with_its_drop() -> None:
    report = summarize(
        fence_applied=APPLIED, dropped=DROPPED, finalize={**FINALIZE, "slot_left_behind": "s1"}
    )
    assert "SELECT pg_drop_replication_slot('s1')" in report["text"]
