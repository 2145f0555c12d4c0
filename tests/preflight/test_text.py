"""Text of the preflight's findings: identifiers a DBA can paste into a statement, and counts."""

from __future__ import annotations

from airflow_pglogrepl.preflight._text import counted, ident, idents


def test_identifiers_are_quoted_as_sql_reads_them() -> None:
    assert ident('Or"ders; x') == '"Or""ders; x"'
    assert idents(["a", 'b"']) == '"a", "b"""'


def test_counted_nouns() -> None:
    assert counted(1, "table") == "1 table"
    assert counted(2, "table") == "2 tables"
    assert counted(0, "index", "indexes") == "0 indexes"
