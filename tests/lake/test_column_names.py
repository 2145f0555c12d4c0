"""Lake names of source columns: every PostgreSQL name gets one, no two clash in Delta (which
compares names without case), and a name once given is never given again or changed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.changelog.columns import META_COLUMNS
from airflow_pglogrepl.lake.column_names import (
    assign,
    needs_mapping,
    same_without_case,
)

pytestmark = pytest.mark.unit

HOSTILE = ["sp ace", "a=b", "x(y)", "tab\there", "naïve✓", "é" * 31 + "x", "Name", "name", "NAME"]


def test_a_free_name_is_kept_and_a_clash_without_case_gets_the_smallest_free_suffix() -> None:
    names = assign(HOSTILE, {}, reserved=META_COLUMNS)
    assert [names[c] for c in HOSTILE] == [
        *HOSTILE[:7], "name__2", "NAME__3",
    ]  # fmt: skip


def test_the_changelogs_own_columns_are_taken() -> None:
    names = assign(["_OP", "_seq"], {}, reserved=META_COLUMNS)
    assert names == {"_OP": "_OP__2", "_seq": "_seq__2"}


def test_a_recorded_name_is_kept_and_stays_taken_for_later_columns() -> None:
    recorded = {"name": "name", "Name": "Name__2"}  # as a first run assigned them
    # a column added with a name clashing with a recorded lake name
    later = ["name", "Name", "NAME__2"]
    assert assign(later, recorded) == {"name": "name", "Name": "Name__2", "NAME__2": "NAME__2__2"}


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        assign(["a", "a"], {})


def test_which_names_need_column_mapping() -> None:
    assert [n for n in HOSTILE if needs_mapping(n)] == ["sp ace", "a=b", "x(y)", "tab\there"]
    assert not needs_mapping("Name__2") and not needs_mapping("naïve✓")


def test_folded_letters_clash_as_delta_may_fold_them() -> None:
    assert same_without_case("STRASSE", "straße") and same_without_case("Σ", "ς")
    names = assign(["straße", "STRASSE"], {})
    assert names == {"straße": "straße", "STRASSE": "STRASSE__2"}


names_st = st.text(min_size=1, max_size=12)


@given(
    first=st.lists(names_st, min_size=1, max_size=8, unique=True),
    second=st.lists(names_st, max_size=8, unique=True),
)
def test_names_never_clash_and_never_change_over_runs(first: list[str], second: list[str]) -> None:
    run1 = assign(first, {}, reserved=META_COLUMNS)
    # the next run: the same columns and new ones after them (a name the first run had is
    # the same column)
    added = [n for n in second if n not in run1]
    run2 = assign([*first, *added], run1, reserved=META_COLUMNS)
    assert {a: run2[a] for a in run1} == run1  # a given name never changes
    lake = [*run2.values(), *META_COLUMNS]
    for i, a in enumerate(lake):
        for b in lake[i + 1 :]:
            assert not same_without_case(a, b), (a, b, run2)
