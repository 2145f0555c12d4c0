"""Slot name validation happens before any statement is built."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import InvalidSlotNameError
from airflow_pglogrepl.names import validate_slot_name


@pytest.mark.parametrize("name", ["a", "drain_orders_1", "x" * 63, "_0"])
def test_valid(name: str) -> None:
    assert validate_slot_name(name) == name


@pytest.mark.parametrize(
    "name", ['we"ird; drop table x', "", "x" * 64, "Upper", "has space", "dash-ed", "ünï"]
)
def test_invalid_names_are_rejected_with_the_fix(name: str) -> None:
    with pytest.raises(InvalidSlotNameError) as info:
        validate_slot_name(name)
    assert repr(name) in str(info.value)
    assert "Fix:" in str(info.value)
    assert isinstance(info.value, ValueError)
