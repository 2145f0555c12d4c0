"""Row filters stay one expression: what would leave the ``WHERE (...)`` is refused."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.row_filter import check_row_filter

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text",
    [
        "region = 'eu' AND NOT deleted",
        "note <> 'a ) , b; -- not code'",  # all of it inside a literal
        '"we)ird" > 0',
        "coalesce(a, b) IN (1, 2, 3)",
        "s = E'it\\'s ) here'",
        "s = 'it''s'",
        "v = x_E'a\\'",  # x_E is one word, so no E'' string: the quote after \\ ends it
    ],
)
def test_expressions_pass(text: str) -> None:
    assert check_row_filter(text, table="public.t") == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("true) , public.secrets WHERE (true", r"closes more"),
        ("a > 1 -- ", "comments"),
        ("a > 1 /* x */", "comments"),
        ("a > 1); DROP TABLE t; (", "closes more|';'"),
        ("a = $$x$$", r"'\$'"),
        ("a = 1, b = 2", "','"),
        ("(a = 1", "not closed"),
        ("s = 'open", "not closed"),
        ("  ", "empty"),
    ],
)
def test_what_would_leave_the_where_is_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=rf"row filter of public\.t .*({reason})"):
        check_row_filter(text, table="public.t")
