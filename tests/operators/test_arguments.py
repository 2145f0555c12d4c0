"""The cutover operators' shared arguments: a name, a list or nothing; the tables named plus a
publication's, each once; nothing to act on is refused."""

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
