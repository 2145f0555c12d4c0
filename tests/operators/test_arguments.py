"""The operators' shared arguments: a name, a list or nothing; the tables named plus a
publication's, each once; nothing to act on is refused; the lake root as ``lake=`` or its old
name ``sink=``, and under both keys in a summary."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.operators.arguments import lake_argument, lake_keys, names, resolve_tables
from airflow_pglogrepl.tables import TableRef


def test_a_name_a_list_or_nothing() -> None:
    assert names(None) == [] and names("app") == ["app"] and names(("a", "b")) == ["a", "b"]


class Publisher:
    """What ``resolve_tables`` asks of a hook: a publication's tables, or None when absent."""

    def __init__(self, publications: dict[str, list[TableRef]]) -> None:
        self.publications = publications

    def publication_tables(self, name: str) -> list[TableRef] | None:
        return self.publications.get(name)


def test_the_tables_named_plus_a_publications_each_once() -> None:
    hook: Any = Publisher({"pub": [TableRef("public", "a"), TableRef("s", "b")]})
    assert resolve_tables(hook, ["public.a", "public.c"], "pub") == [
        TableRef("public", "a"), TableRef("public", "c"), TableRef("s", "b")
    ]  # fmt: skip
    assert resolve_tables(hook, [], "pub") == [TableRef("public", "a"), TableRef("s", "b")]


def test_a_missing_publication_or_no_table_at_all_is_refused() -> None:
    hook: Any = Publisher({"empty": []})
    with pytest.raises(ObjectNotFoundError, match="'absent' does not exist"):
        resolve_tables(hook, ["public.a"], "absent")
    with pytest.raises(ValueError, match="no tables"):
        resolve_tables(hook, [], "empty")


def test_the_lake_root_is_lake_or_its_old_name_sink_with_a_warning() -> None:
    assert lake_argument("SlotDrainOperator", "/l", None) == "/l"
    with pytest.warns(DeprecationWarning, match=r"SlotDrainOperator: sink= is now lake="):
        assert lake_argument("SlotDrainOperator", None, "/l") == "/l"
    with pytest.warns(DeprecationWarning):  # the same root twice is one root
        assert lake_argument("SlotDrainOperator", "/l", "/l") == "/l"


def test_no_lake_is_refused_and_two_different_ones_use_lake_repeating_neither() -> None:
    """Both: a DAG moved to lake= whose default_args still say sink=; the explicit name wins.
    A lake URI may hold a secret, so no message repeats either."""
    with pytest.raises(TypeError, match=r"LakeUpkeepOperator needs lake="):
        lake_argument("LakeUpkeepOperator", None, None)
    new, old = "s3://AKIDNEW:s3cr3t-new@b/new", "s3://AKIDOLD:s3cr3t-old@b/old"
    with pytest.warns(DeprecationWarning, match=r"lake= is used and sink= ignored") as told:
        assert lake_argument("LakeUpkeepOperator", new, old) == new
    assert not any("s3cr3t" in str(w.message) or "AKID" in str(w.message) for w in told)


def test_the_summary_names_the_lake_under_its_new_and_old_keys() -> None:
    assert lake_keys("s3://b/l") == {"lake": "s3://b/l", "sink": "s3://b/l"}


@pytest.mark.parametrize("operator", ["drain", "snapshot", "upkeep"])
def test_each_lake_operator_takes_sink_as_lake_and_templates_lake(operator: str) -> None:
    from airflow_pglogrepl.operators.drain import SlotDrainOperator
    from airflow_pglogrepl.operators.snapshot import InitialSnapshotOperator
    from airflow_pglogrepl.operators.upkeep import LakeUpkeepOperator

    kind = {"drain": SlotDrainOperator, "snapshot": InitialSnapshotOperator,
            "upkeep": LakeUpkeepOperator}[operator]  # fmt: skip
    common: dict[str, Any] = {"postgres_conn_id": "pg", "slot_name": "s"}
    if operator != "upkeep":
        common["publications"] = ["p"]
    with pytest.warns(DeprecationWarning, match=rf"{kind.__name__}: sink= is now lake=") as told:
        task = kind(task_id="old", sink="/data/lake", **common)
    assert [w.filename for w in told] == [__file__]  # the DAG's line, past Airflow's wrappers
    assert task.lake == "/data/lake"
    with pytest.warns(DeprecationWarning, match=rf"{kind.__name__}: \.sink is now \.lake"):
        assert task.sink == "/data/lake"  # {{ task.sink }}, a subclass reading self.sink
    with pytest.warns(DeprecationWarning):
        task.sink = "/data/other"
    assert task.lake == "/data/other"
    assert "lake" in kind.template_fields and "sink" not in kind.template_fields
    assert kind(task_id="new", lake="/data/lake", **common).lake == "/data/lake"


def test_the_applications_take_the_old_flag_too() -> None:
    from airflow_pglogrepl.spark import drain_app, snapshot_app

    for app in (drain_app, snapshot_app):
        for flag in ("--lake", "--sink"):
            args = app.parse_args(["--slot", "s", "--publication", "p", flag, "/l"])
            assert args.lake_root == "/l", (app, flag)
