"""The operators' shared arguments: a name, a list or nothing; the tables named plus a
publication's, each once; nothing to act on is refused; the lake operators' required ``lake=``,
and the applications' ``--lake``."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.operators.arguments import names, resolve_tables
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


@pytest.mark.parametrize("operator", ["drain", "snapshot", "upkeep"])
def test_each_lake_operator_needs_lake_and_templates_it(operator: str) -> None:
    from airflow_pglogrepl.operators.drain import SlotDrainOperator
    from airflow_pglogrepl.operators.snapshot import InitialSnapshotOperator
    from airflow_pglogrepl.operators.upkeep import LakeUpkeepOperator

    kind = {"drain": SlotDrainOperator, "snapshot": InitialSnapshotOperator,
            "upkeep": LakeUpkeepOperator}[operator]  # fmt: skip
    common: dict[str, Any] = {"postgres_conn_id": "pg", "slot_name": "s"}
    if operator != "upkeep":
        common["publications"] = ["p"]
    with pytest.raises(TypeError, match=r"missing keyword argument 'lake'"):
        kind(task_id="none", **common)
    assert "lake" in kind.template_fields
    assert kind(task_id="new", lake="/data/lake", **common).lake == "/data/lake"


def test_the_applications_take_the_lake_root_as_lake() -> None:
    from airflow_pglogrepl.spark import drain_app, snapshot_app

    for app in (drain_app, snapshot_app):
        args = app.parse_args(["--slot", "s", "--publication", "p", "--lake", "/l"])
        assert args.lake_root == "/l", app
