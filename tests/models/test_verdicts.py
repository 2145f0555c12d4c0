"""Sensor and health decisions from facts: the same rules serve poke and deferrable modes."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import RelState, SlotInfo, SubscriptionStatus
from airflow_pglogrepl.models.verdicts import (
    HealthPolicy,
    reached,
    slot_health,
    slot_lag,
    subscription_ready,
)
from airflow_pglogrepl.tables import TableRef

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _status(*states: str, **kw: object) -> SubscriptionStatus:
    rels = tuple(RelState(TableRef("public", f"t{i}"), s, None) for i, s in enumerate(states))
    defaults: dict[str, object] = {"enabled": True, "workers": 1, "sync_error_count": 0}
    return SubscriptionStatus(name="sub", exists=True, relations=rels, **{**defaults, **kw})  # type: ignore[arg-type]


def _ready(status: SubscriptionStatus, workerless_s: float = 0.0):  # type: ignore[no-untyped-def]
    return subscription_ready(
        status, max_sync_errors=3, workerless_s=workerless_s, worker_grace_s=60
    )


def test_all_ready() -> None:
    verdict = _ready(_status("r", "r"))
    assert verdict.done and not verdict.failed
    assert verdict.data["state_counts"] == {"r": 2}


def test_waiting_names_tables_and_counts() -> None:
    verdict = _ready(_status("r", "d", "i"))
    assert not verdict.done and not verdict.failed
    assert "public.t1 (copying data)" in verdict.message
    assert "initialize=1" in verdict.message and "ready=1" in verdict.message


def test_no_relations_yet_waits() -> None:
    assert not _ready(_status()).done


def test_missing_subscription_fails() -> None:
    verdict = _ready(SubscriptionStatus(name="gone", exists=False))
    assert verdict.failed and "'gone' does not exist" in verdict.message


def test_sync_errors_fail_fast_naming_tables() -> None:
    verdict = _ready(_status("r", "d", sync_error_count=3))
    assert verdict.failed
    assert "public.t1" in verdict.message and "3 times" in verdict.message
    assert not _ready(_status("r", "d", sync_error_count=2)).failed


def test_disabled_with_pending_tables_fails() -> None:
    assert _ready(_status("d", enabled=False)).failed
    assert _ready(_status("r", enabled=False)).done


def test_no_worker_fails_only_after_grace() -> None:
    status = _status("d", workers=0)
    assert not _ready(status, workerless_s=10).failed
    assert _ready(status, workerless_s=61).failed


def _slot(**kw: object) -> SlotInfo:
    base: dict[str, object] = dict(
        name="s", plugin="pgoutput", slot_type="logical", database="db", temporary=False,
        active=False, active_pid=None, restart_lsn=LSN("0/100"),
        confirmed_flush_lsn=LSN("0/1000"), wal_status="reserved", safe_wal_size=None,
        two_phase=False, retained_bytes=0x1F00, current_lsn=LSN("0/2000"),
    )  # fmt: skip
    return SlotInfo(**{**base, **kw})  # type: ignore[arg-type]


def test_slot_lag() -> None:
    assert slot_lag(_slot(), max_lag_bytes=0x1000).done
    verdict = slot_lag(_slot(), max_lag_bytes=0xFFF)
    assert not verdict.done and verdict.data["lag_bytes"] == 0x1000
    assert slot_lag(_slot(wal_status="lost"), max_lag_bytes=10**9).failed


def test_reached() -> None:
    assert reached(LSN("0/10"), LSN("0/10"), what="x").done
    verdict = reached(LSN("0/F"), LSN("0/10"), what="x")
    assert not verdict.done and verdict.data["behind_bytes"] == 1
    assert not reached(None, LSN("0/1"), what="x").done


@pytest.mark.parametrize(
    ("slot", "policy", "expect"),
    [
        (_slot(), HealthPolicy(), []),
        (_slot(wal_status="lost"), HealthPolicy(), ["is lost"]),
        (_slot(wal_status="unreserved"), HealthPolicy(), ["unreserved"]),
        (_slot(plugin="test_decoding"), HealthPolicy(plugin="pgoutput"), ["uses plugin"]),
        (_slot(retained_bytes=2000), HealthPolicy(max_retained_bytes=1000), ["retains 2000"]),
        (_slot(retained_bytes=900), HealthPolicy(max_retained_fraction=0.8), ["90%"]),
        (_slot(active=True, active_pid=42), HealthPolicy(allow_active=False), ["PID 42"]),
    ],
)
def test_slot_health(slot: SlotInfo, policy: HealthPolicy, expect: list[str]) -> None:
    problems = slot_health(slot, policy, max_slot_wal_keep_size=1000, inactive_since=None, now=NOW)
    assert len(problems) == len(expect)
    for problem, fragment in zip(problems, expect, strict=True):
        assert fragment in problem and "'s'" in problem


def test_inactive_too_long() -> None:
    policy = HealthPolicy(max_inactive=dt.timedelta(hours=1))
    since = NOW - dt.timedelta(hours=2)
    problems = slot_health(
        _slot(), policy, max_slot_wal_keep_size=None, inactive_since=since, now=NOW
    )
    assert len(problems) == 1 and "inactive for 2:00:00" in problems[0]
    recent = NOW - dt.timedelta(minutes=5)
    assert not slot_health(
        _slot(), policy, max_slot_wal_keep_size=None, inactive_since=recent, now=NOW
    )


@pytest.mark.parametrize(
    ("reason", "cause", "prevent"),
    [
        (None, "the WAL it needed was removed", "max_slot_wal_keep_size"),
        ("wal_removed", "invalidated (wal_removed)", "max_slot_wal_keep_size"),
        ("idle_timeout", "idle_replication_slot_timeout", "0 turns it off"),
        ("rows_removed", "VACUUM on the primary", "hot_standby_feedback"),
        ("some_new_reason", "invalidated (some_new_reason)", "server log"),
    ],
)
def test_a_lost_slot_says_the_servers_reason_and_what_prevents_it(
    reason: str | None, cause: str, prevent: str
) -> None:
    """PostgreSQL 17+ says why a slot was invalidated; the advice follows the reason (an idle
    timeout on 18 is not cured by max_slot_wal_keep_size)."""
    from airflow_pglogrepl.models.verdicts import drain_refusal

    slot = _slot(wal_status="lost", invalidation_reason=reason)
    (problem,) = slot_health(
        slot, HealthPolicy(), max_slot_wal_keep_size=None, inactive_since=None, now=NOW
    )
    refusal = drain_refusal(slot)
    assert refusal is not None
    for text in (problem, str(refusal)):
        assert cause in text and prevent in text and "drop it and start again" in text


def test_an_idle_slot_is_reported_before_the_idle_timeout_invalidates_it() -> None:
    """PostgreSQL 18's idle_replication_slot_timeout: at half of it the check fails, naming the
    time left; an active slot, or one idle for less, passes."""

    def problems(idle: dt.timedelta, active: bool = False) -> list[str]:
        return slot_health(
            _slot(active=active), HealthPolicy(), max_slot_wal_keep_size=None,
            inactive_since=NOW - idle, now=NOW, idle_timeout_s=3600,
        )  # fmt: skip

    (problem,) = problems(dt.timedelta(minutes=40))
    assert "idle_replication_slot_timeout is 1:00:00" in problem and "0:20:00 more" in problem
    assert problems(dt.timedelta(minutes=20)) == []
    assert problems(dt.timedelta(minutes=40), active=True) == []


def test_a_synced_slot_is_exempt_from_the_idle_timeout_only_on_a_standby() -> None:
    """The server exempts a standby's synchronized copy; once promoted, the copy keeps
    ``synced = true`` and is invalidated as any other slot. Before, it was exempt anywhere."""

    def problems(in_recovery: bool) -> list[str]:
        return slot_health(
            _slot(synced=True), HealthPolicy(), max_slot_wal_keep_size=None,
            inactive_since=NOW - dt.timedelta(minutes=40), now=NOW, idle_timeout_s=3600,
            in_recovery=in_recovery,
        )  # fmt: skip

    assert problems(in_recovery=True) == []
    (problem,) = problems(in_recovery=False)
    assert "idle_replication_slot_timeout" in problem
