"""SQLSTATE classes map to the project's exceptions, naming the slot and the fix."""

from __future__ import annotations

import pytest
from psycopg import errors as pgerr

from airflow_pglogrepl.exceptions import (
    InvalidSlotNameError,
    ServerNotConfiguredError,
    SlotAdvanceError,
    SlotAlreadyExistsError,
    SlotInUseError,
    SlotNotFoundError,
)
from airflow_pglogrepl.postgres.errors import slot_errors


def _raise_in_mapper(error: Exception, settings: dict[str, str] | None = None) -> None:
    with slot_errors("s1", setting=lambda name: (settings or {})[name]):
        raise error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (pgerr.UndefinedObject('replication slot "s1" does not exist'), SlotNotFoundError),
        (pgerr.DuplicateObject('replication slot "s1" already exists'), SlotAlreadyExistsError),
        (pgerr.InvalidName("contains invalid character"), InvalidSlotNameError),
        (pgerr.InvalidParameterValue("cannot advance replication slot to 0/1, minimum is 0/2"),
         SlotAdvanceError),
    ],
)  # fmt: skip
def test_slot_errors(error: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected) as info:
        _raise_in_mapper(error)
    assert "'s1'" in str(info.value)
    assert info.value.__cause__ is error


def test_in_use_carries_the_pid() -> None:
    with pytest.raises(SlotInUseError) as info:
        _raise_in_mapper(pgerr.ObjectInUse('replication slot "s1" is active for PID 4242'))
    assert info.value.active_pid == 4242
    assert "4242" in str(info.value)


def test_wal_level_error_names_setting_current_value_and_fix() -> None:
    error = pgerr.ObjectNotInPrerequisiteState("logical decoding requires wal_level >= logical")
    with pytest.raises(ServerNotConfiguredError) as info:
        _raise_in_mapper(error, {"wal_level": "replica"})
    text = str(info.value)
    assert info.value.setting == "wal_level"
    assert "'replica'" in text and "restart" in text


def test_slot_capacity_error_names_max_replication_slots() -> None:
    error = pgerr.ConfigurationLimitExceeded("all replication slots are in use")
    with pytest.raises(ServerNotConfiguredError) as info:
        _raise_in_mapper(error, {"max_replication_slots": "2"})
    assert info.value.setting == "max_replication_slots"
    assert "'2'" in str(info.value)


def test_other_errors_pass_through() -> None:
    error = pgerr.SyntaxError("oops")
    with pytest.raises(pgerr.SyntaxError):
        _raise_in_mapper(error)
