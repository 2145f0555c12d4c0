"""Identifiers: slot names are validated before any statement is built, and pgoutput's
publication_names splits as the server splits it (the inverse of how we write it).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.exceptions import InvalidSlotNameError
from airflow_pglogrepl.identifiers import (
    publication_list,
    publication_names_option,
    validate_slot_name,
)


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


def test_quoted_unquoted_and_spaces() -> None:
    text = ' Plain , "Keep Case" ,"a,b", "say ""hi"""'
    assert publication_list({"publication_names": text}) == ["plain", "Keep Case", "a,b",
                                                              'say "hi"']  # fmt: skip
    assert publication_list({}) == []


def test_only_ascii_folds_and_long_names_are_cut_as_the_server_cuts_them() -> None:
    assert publication_list({"publication_names": "Café,ÉTÉ"}) == ["café", "ÉtÉ"]
    long = "é" * 40  # 80 bytes: cut to 31 whole characters (62 bytes), not inside the 32nd
    assert publication_list({"publication_names": f'"{long}"'}) == ["é" * 31]


@given(
    st.lists(
        st.text(min_size=1).filter(lambda s: "\x00" not in s and len(s.encode()) < 64),
        min_size=1,
        max_size=4,
    )
)
def test_what_we_quote_splits_back_to_the_names(names: list[str]) -> None:
    text = publication_names_option(names)
    assert publication_list({"publication_names": text}) == names
