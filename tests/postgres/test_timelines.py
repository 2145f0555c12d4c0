"""A promoted server's timeline history (``postgres.timelines``): each ancestor timeline with
the LSN where the history left it, read as the server writes its history files. The live
promotion is in ``tests/pipeline/test_failover.py``."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.timelines import parse_history, switch_points


def test_a_history_file_gives_each_ancestor_and_where_it_was_left() -> None:
    content = (
        "1\t0/3000060\tno recovery target specified\n"
        "\n"
        "# a comment, as the server's reader allows\n"
        "2\t0/50001A8\tbefore 2026-12-04 23:00:00+00\n"
    )
    assert parse_history(content) == {1: LSN("0/3000060"), 2: LSN("0/50001A8")}
    assert parse_history("") == {}


@pytest.mark.parametrize("line", ["one\t0/1\tx", "1"])
def test_a_line_that_is_no_history_line_is_refused(line: str) -> None:
    with pytest.raises(ValueError, match="not a timeline history line"):
        parse_history(line)


def test_the_first_timeline_has_no_ancestors_and_asks_nothing() -> None:
    assert switch_points(None, 1) == {}  # type: ignore[arg-type]
