"""CreatePublicationOperator: row filters are not templated, and one that would leave its
``WHERE (...)`` is refused before anything reaches the server.
"""

from __future__ import annotations

import pytest

from airflow_pglogrepl.operators.publication import CreatePublicationOperator
from tests.support.airflow import context
from tests.support.cutover import Pair


def test_row_filters_are_not_templated() -> None:
    """A DAG run's conf reaches an operator only through templated fields."""
    assert "row_filters" not in CreatePublicationOperator.template_fields


# The tests below depend on the server's major version: make test runs them on 15 to 18.


@pytest.mark.pgversion
def test_a_row_filter_cannot_leave_its_where(pair: Pair) -> None:
    """Before: the filter was pasted as given, and this one published a second table."""
    pair.pub("CREATE TABLE open_t (id int PRIMARY KEY, region text);"
             " CREATE TABLE secret_t (id int PRIMARY KEY)")  # fmt: skip
    operator = CreatePublicationOperator(
        task_id="pub", publication="filtered", postgres_conn_id=pair.pub_conn, tables=["open_t"],
        row_filters={"open_t": "true) , public.secret_t WHERE (true"},
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"row filter of public\.open_t .*closes more"):
        operator.execute(context())
    assert pair.pub("SELECT tablename FROM pg_publication_tables WHERE pubname = 'filtered'") == []
