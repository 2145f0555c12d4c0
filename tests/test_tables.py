"""Table names parse as PostgreSQL reads them: unquoted folds, quoted is verbatim."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.tables import TableRef, parse_tables


@pytest.mark.parametrize(
    ("text", "schema", "name"),
    [
        ("orders", "public", "orders"),
        ("Sales.Orders", "sales", "orders"),
        ('"Sales"."Orders"', "Sales", "Orders"),
        ('"we.ird"."ta""ble; drop table x"', "we.ird", 'ta"ble; drop table x'),
        (' app . "Ünïcode tåble" ', "app", "Ünïcode tåble"),
    ],
)
def test_parse(text: str, schema: str, name: str) -> None:
    assert TableRef.parse(text) == TableRef(schema, name)


@pytest.mark.parametrize("text", ["", "a.b.c", '"open', "a..b", "a.", 'a"b', "a b"])
def test_invalid(text: str) -> None:
    with pytest.raises(ValueError):
        TableRef.parse(text)


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_str_round_trips(schema: str, name: str) -> None:
    ref = TableRef(schema, name)
    assert TableRef.parse(str(ref)) == ref


def test_duplicates_after_folding_are_rejected() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_tables(["Orders", "public.orders"])
    assert parse_tables([("s", "t"), "u"]) == [TableRef("s", "t"), TableRef("public", "u")]
