"""What the lake says of its snapshots, and the bootstrap rule the operator and the snapshot
application share: a slot is replaced only when nothing depends on it."""

from __future__ import annotations

import os

import pytest

from airflow_pglogrepl.exceptions import LakeNotEmptyError, SlotError
from airflow_pglogrepl.lake.snapshots import bootstrap_plan, temporary_slot_name

EMPTY = {"commits": 0, "snapshot_lsn": None, "uncommitted_snapshots": []}


def plan(status: dict[str, object], **options: object) -> str:
    arguments: dict[str, object] = {
        "slot": "s", "slot_exists": True, "lake": "/lake", "replace_slot": False,
        "bootstrap": True, **options,
    }  # fmt: skip
    return bootstrap_plan(status=status, **arguments).action  # type: ignore[arg-type]


def test_an_empty_looking_lake_does_not_drop_an_existing_slot() -> None:
    with pytest.raises(SlotError, match=r"volume not mounted.*replace_slot=True"):
        plan(EMPTY, slot_lsn="0/3000060")


def test_a_killed_runs_snapshot_at_the_slots_position_lets_bootstrap_replace_it() -> None:
    left = {**EMPTY, "uncommitted_snapshots": ["0/3000060"]}
    assert plan(left, slot_lsn="0/3000060") == "replace_slot"
    with pytest.raises(SlotError):  # the slot moved since: some lake consumed it
        plan(left, slot_lsn="0/3000100")


def test_replace_slot_is_the_explicit_signal_and_the_other_plans_stay() -> None:
    assert plan(EMPTY, slot_lsn="0/1", replace_slot=True) == "replace_slot"
    assert plan(EMPTY, slot_exists=False) == "create"
    assert plan({**EMPTY, "commits": 3, "snapshot_lsn": "0/5"}) == "exists"
    assert plan({**EMPTY, "commits": 3}) == "drained"
    with pytest.raises(LakeNotEmptyError):
        plan({**EMPTY, "commits": 3}, slot_exists=False)


def test_a_temporary_slots_name_fits_the_limit_and_is_the_processes_own() -> None:
    name = temporary_slot_name("s" * 63)
    assert len(name) == 63 and name.endswith(f"_rs{os.getpid()}")
    assert temporary_slot_name("lake") == f"lake_rs{os.getpid()}"
