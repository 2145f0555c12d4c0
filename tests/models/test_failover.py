"""Failover slots decided from facts (``models.failover``): when a new slot is made one, and
whether a promotion would keep the drain's slot, each way it would not named with its fix."""

from __future__ import annotations

import dataclasses
import re

import pytest

from airflow_pglogrepl.exceptions import FailoverSlotUnsupportedError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.failover import (
    FailoverPrimary,
    FailoverStandby,
    failover_readiness,
    wants_failover,
)
from airflow_pglogrepl.models.records import SlotInfo

pytestmark = pytest.mark.unit


def _slot(**kw: object) -> SlotInfo:
    base: dict[str, object] = dict(
        name="drain", plugin="pgoutput", slot_type="logical", database="db", temporary=False,
        active=False, active_pid=None, restart_lsn=LSN("0/100"),
        confirmed_flush_lsn=LSN("0/3000"), wal_status="reserved", safe_wal_size=None,
        two_phase=False, retained_bytes=0, current_lsn=LSN("0/4000"), failover=True,
    )  # fmt: skip
    return SlotInfo(**{**base, **kw})  # type: ignore[arg-type]


PRIMARY = FailoverPrimary(server="p:5432", version_num=170005, slot=_slot(),
                          synchronized_standby_slots=("sb1",),
                          standby_slots_active={"sb1": True}, system_identifier="7")  # fmt: skip
STANDBY = FailoverStandby(server="s:5432", in_recovery=True, sync_replication_slots=True,
                          hot_standby_feedback=True, primary_slot_name="sb1",
                          conninfo_has_dbname=True,
                          copy=_slot(synced=True, confirmed_flush_lsn=LSN("0/2800")),
                          system_identifier="7")  # fmt: skip


def test_a_new_slot_is_a_failover_slot_wherever_the_server_can_keep_one() -> None:
    def auto(version: int, *, standby: bool = False, temporary: bool = False) -> bool:
        return wants_failover("s", "p", version, in_hot_standby=standby, requested=None,
                              temporary=temporary)  # fmt: skip

    assert auto(170000) and auto(180001)
    assert not auto(160008) and not auto(150013)
    assert not auto(170000, standby=True) and not auto(170000, temporary=True)
    assert not wants_failover("s", "p", 180000, in_hot_standby=False, requested=False)
    assert wants_failover("s", "p", 170000, in_hot_standby=False, requested=True)


@pytest.mark.parametrize(
    ("version", "standby", "temporary", "said"),
    [
        (160004, False, False, "need PostgreSQL 17, and it runs 16"),
        (170004, True, False, "it is a standby"),
        (170004, False, True, "temporary slot"),
    ],
)
def test_a_failover_slot_asked_for_where_the_server_cannot_keep_one_is_refused(
    version: int, standby: bool, temporary: bool, said: str
) -> None:
    with pytest.raises(FailoverSlotUnsupportedError, match=said) as info:
        wants_failover("drain", "p:5432", version, in_hot_standby=standby, requested=True,
                       temporary=temporary)  # fmt: skip
    assert "'drain'" in str(info.value) and "Fix:" in str(info.value)


def test_a_synchronized_ready_copy_held_back_by_the_primary_is_ready() -> None:
    verdict = failover_readiness(PRIMARY, [STANDBY])
    assert verdict.ready and verdict.problems == ()
    assert verdict.standbys_ready == ("s:5432",) and verdict.standby_lag_bytes == 0x800
    assert verdict.to_dict()["ready"] is True


def test_before_17_the_check_says_failover_slots_need_17() -> None:
    old = dataclasses.replace(PRIMARY, version_num=160004, synchronized_standby_slots=())
    verdict = failover_readiness(old, [STANDBY])
    assert not verdict.ready
    assert len(verdict.problems) == 1 and "need PostgreSQL 17" in verdict.problems[0]
    assert "runs 16" in verdict.problems[0]


@pytest.mark.parametrize(
    ("primary", "standby", "said"),
    [
        ({"slot": _slot(failover=False)}, {}, "not a failover slot"),
        ({"synchronized_standby_slots": (), "standby_slots_active": {}}, {},
         "synchronized_standby_slots is empty"),
        ({"standby_slots_active": {}}, {}, "no physical slot there"),
        ({"standby_slots_active": {"sb1": False}}, {}, "no standby streams through 'sb1'"),
        ({}, {"in_recovery": False}, "is not a standby"),
        ({}, {"sync_replication_slots": False}, "sync_replication_slots is off"),
        ({}, {"hot_standby_feedback": False}, "hot_standby_feedback is off"),
        ({}, {"primary_slot_name": None}, "primary_slot_name is not set"),
        ({}, {"conninfo_has_dbname": False}, "names no dbname"),
        ({}, {"primary_slot_name": "sb2"}, "does not name: the drain may confirm"),
        ({}, {"copy": None}, "holds no copy"),
        ({}, {"copy": _slot(synced=False)}, "of its own, not synchronized"),
        ({}, {"copy": _slot(synced=True, temporary=True)}, "not ready yet"),
        ({}, {"copy": _slot(synced=True, invalidation_reason="rows_removed")},
         "invalidated \\(rows_removed\\)"),
        ({}, {"wal_level": "replica"}, "wal_level is replica"),
        ({}, {"system_identifier": "8"}, "is not a standby of p:5432"),
    ],
)  # fmt: skip
def test_each_thing_that_would_lose_the_slot_in_a_promotion_is_named_with_its_fix(
    primary: dict[str, object], standby: dict[str, object], said: str
) -> None:
    verdict = failover_readiness(
        dataclasses.replace(PRIMARY, **primary),  # type: ignore[arg-type]
        [dataclasses.replace(STANDBY, **standby)],
    )  # type: ignore[arg-type]
    assert not verdict.ready
    assert any(re.search(said, p) for p in verdict.problems), verdict.problems
    assert all("Fix:" in p for p in verdict.problems)


def test_no_standby_checked_is_not_ready() -> None:
    verdict = failover_readiness(PRIMARY, [])
    assert not verdict.ready and "standby_conn_ids" in verdict.problems[0]


def test_a_standby_that_could_not_be_asked_is_named_as_such() -> None:
    """Before, the verdict also said that no standby was given, which was not so."""
    verdict = failover_readiness(PRIMARY, [], ["standby 'sb' could not be checked: refused"])
    assert not verdict.ready and verdict.problems == ("standby 'sb' could not be checked: "
                                                      "refused",)  # fmt: skip


def test_a_primary_that_is_a_standby_itself_is_named() -> None:
    verdict = failover_readiness(dataclasses.replace(PRIMARY, in_recovery=True), [STANDBY])
    assert not verdict.ready and "point postgres_conn_id at the primary" in verdict.problems[0]


def test_a_primary_conninfo_the_role_may_not_read_is_not_a_problem() -> None:
    verdict = failover_readiness(PRIMARY, [dataclasses.replace(STANDBY, conninfo_has_dbname=None)])
    assert verdict.ready
