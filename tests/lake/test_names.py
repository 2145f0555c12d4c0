"""Lake names of source columns: every PostgreSQL name gets one, no two clash in Delta (which
compares names without case), and a name once given is never given again or changed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.lake.changelog import META_COLUMNS
from airflow_pglogrepl.lake.names import (
    SourceColumn,
    assign,
    needs_mapping,
    same_without_case,
)

pytestmark = pytest.mark.unit

HOSTILE = ["sp ace", "a=b", "x(y)", "tab\there", "naïve✓", "é" * 31 + "x", "Name", "name", "NAME"]


def test_a_free_name_is_kept_and_a_clash_without_case_gets_the_smallest_free_suffix() -> None:
    columns = [SourceColumn(i + 1, name) for i, name in enumerate(HOSTILE)]
    names = assign(columns, {}, reserved=META_COLUMNS)
    assert [names[c.attnum] for c in columns] == [
        *HOSTILE[:7], "name__2", "NAME__3",
    ]  # fmt: skip


def test_the_changelogs_own_columns_are_taken() -> None:
    names = assign([SourceColumn(1, "_OP"), SourceColumn(2, "_seq")], {}, reserved=META_COLUMNS)
    assert names == {1: "_OP__2", 2: "_seq__2"}


def test_a_recorded_name_is_kept_and_stays_taken_for_later_columns() -> None:
    recorded = {1: "name", 2: "Name__2"}  # as a first run assigned them
    # attnum 2 renamed at the source, attnum 3 added with a name clashing with a recorded one
    later = [SourceColumn(1, "name"), SourceColumn(2, "renamed"), SourceColumn(3, "NAME__2")]
    assert assign(later, recorded) == {1: "name", 2: "Name__2", 3: "NAME__2__2"}


def test_the_order_a_batch_lists_columns_in_does_not_change_their_names() -> None:
    forward = [SourceColumn(1, "Name"), SourceColumn(2, "name")]
    assert assign(forward, {}) == assign(list(reversed(forward)), {}) == {1: "Name", 2: "name__2"}


def test_which_names_need_column_mapping() -> None:
    assert [n for n in HOSTILE if needs_mapping(n)] == ["sp ace", "a=b", "x(y)", "tab\there"]
    assert not needs_mapping("Name__2") and not needs_mapping("naïve✓")


def test_folded_letters_clash_as_delta_may_fold_them() -> None:
    assert same_without_case("STRASSE", "straße") and same_without_case("Σ", "ς")
    names = assign([SourceColumn(1, "straße"), SourceColumn(2, "STRASSE")], {})
    assert names == {1: "straße", 2: "STRASSE__2"}


names_st = st.text(min_size=1, max_size=12)


@given(
    first=st.lists(names_st, min_size=1, max_size=8),
    second=st.lists(names_st, max_size=8),
)
def test_names_never_clash_and_never_change_over_runs(first: list[str], second: list[str]) -> None:
    run1 = assign([SourceColumn(i + 1, n) for i, n in enumerate(first)], {}, reserved=META_COLUMNS)
    # the next run: the same columns (some renamed at the source) and new ones after them
    again = [SourceColumn(i + 1, n + "x") for i, n in enumerate(first)]
    added = [SourceColumn(len(first) + i + 1, n) for i, n in enumerate(second)]
    run2 = assign([*again, *added], run1, reserved=META_COLUMNS)
    assert {a: run2[a] for a in run1} == run1  # a given name never changes
    lake = [*run2.values(), *META_COLUMNS]
    for i, a in enumerate(lake):
        for b in lake[i + 1 :]:
            assert not same_without_case(a, b), (a, b, run2)
