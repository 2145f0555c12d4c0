"""The lake's layout: table directories round-trip and are safe; paths accept file URIs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.lake.layout import LakePaths, table_dir, table_from_dir
from airflow_pglogrepl.tables import TableRef

pytestmark = pytest.mark.unit

A, B = TableRef("public", "a"), TableRef("public", "b")


@given(st.text(min_size=1), st.text(min_size=1))
def test_table_dir_round_trips_and_is_safe(schema: str, name: str) -> None:
    ref = TableRef(schema, name)
    directory = table_dir(ref)
    assert table_from_dir(directory) == ref
    assert "/" not in directory and "=" not in directory and directory.count(".") == 1
    assert not directory.startswith(("_", "."))


@pytest.mark.parametrize(
    ("schema", "name", "expected"),
    [("public", "orders", "public.orders"), ("_hidden", "t", "~5Fhidden.t"),
     ("a.b", "c/d=e", "a~2Eb.c~2Fd~3De"), ("s", "_t", "s.~5Ft"),
     ("é ~", "x%y", "~C3~A9~20~7E.x~25y")],
)  # fmt: skip
def test_table_dir_examples(schema: str, name: str, expected: str) -> None:
    assert table_dir(TableRef(schema, name)) == expected
    assert table_from_dir(expected) == TableRef(schema, name)


def test_paths_accept_file_uris_and_name_every_table() -> None:
    paths = LakePaths("file:///data/lake/")
    assert paths.root == "/data/lake" and paths.local
    assert paths.changes(A) == "/data/lake/changes/public.a"
    assert paths.state(A) == "/data/lake/state/public.a"
    assert paths.windows() == "/data/lake/_pglogrepl/windows"
    assert not LakePaths("s3://bucket/lake").local
