"""The write fence's state (``RoleFence``): kept in a role setting's text, hostile names and all."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.models.fence import FenceGrant, RoleFence, parse_role_settings
from airflow_pglogrepl.tables import TableRef
from tests.support.cutover import HOSTILE

# -- fence state -----------------------------------------------------------------------------------


def test_role_fence_round_trips_hostile_names_through_its_setting_text() -> None:
    state = RoleFence(
        role='app "x"; y',
        read_only_set=True,
        previous_read_only="off",
        grants=(FenceGrant(HOSTILE, "INSERT", True), FenceGrant(TableRef("public", "t"), "DELETE")),
    )
    text = state.to_json()
    assert "\n" not in text and "=" not in text.split(":", 1)[0]
    back = RoleFence.from_json(state.role, text)
    assert back.read_only_set and back.previous_read_only == "off"
    assert sorted(back.grants) == sorted(state.grants)
    # The catalog stores it as one ``name=value`` item; splitting at the first '=' recovers it.
    settings = parse_role_settings([f"pglogrepl.fence_state={text}", "search_path=a, b"])
    assert RoleFence.from_json(state.role, settings["pglogrepl.fence_state"]) == back
    assert settings["search_path"] == "a, b"


def test_role_fence_grows_and_never_forgets() -> None:
    first = RoleFence("app").with_grants([FenceGrant(HOSTILE, "INSERT", True)])
    # A repeat run finds the privilege gone already: it must keep what the first run saved.
    again = first.with_grants([FenceGrant(HOSTILE, "INSERT", False), FenceGrant(HOSTILE, "UPDATE")])
    assert again.grants == (FenceGrant(HOSTILE, "INSERT", True), FenceGrant(HOSTILE, "UPDATE"))
    assert first.with_grants([]) == first


def test_role_fence_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match=r"unknown pglogrepl\.fence_state format"):
        RoleFence.from_json("app", '{"v": 2, "grants": []}')
    assert parse_role_settings(None) == {}
