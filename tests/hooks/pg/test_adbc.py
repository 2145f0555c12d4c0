"""The ADBC peek's arguments: bound as one text-array literal, never spliced into SQL."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_peek_arguments_travel_as_a_text_array_literal_not_sql() -> None:
    from airflow_pglogrepl.hooks.pg.adbc import text_array_literal

    assert text_array_literal(["publication_names", '"a ""b""", c\\d']) == (
        '{"publication_names","\\"a \\"\\"b\\"\\"\\", c\\\\d"}'
    )
