"""The one catalog reader of columns: what older rows read for a column added with a default
(``attmissingval``), as the type prints it, whatever the type's array delimiter."""

from __future__ import annotations

import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.postgres.columns import _sole_element, column_origins
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster


@pytest.mark.parametrize(
    ("literal", "element"),
    [
        ("{7}", "7"),
        ('{"(2,2),(1,1)"}', "(2,2),(1,1)"),
        ("{(2,2),(1,1)}", "(2,2),(1,1)"),  # box: its delimiter is ';', so no quotes
        ('{"a \\"quoted\\" \\\\ text"}', 'a "quoted" \\ text'),
        ('{""}', ""),
        ('{"NULL"}', "NULL"),
        ("{NULL}", None),
        ('{"{1,2}"}', "{1,2}"),
        (None, None),
    ],
)
def test_the_sole_element_of_an_array_literal(literal: str | None, element: str | None) -> None:
    assert _sole_element(literal) == element


def test_older_rows_read_the_default_as_the_type_prints_it(publisher: PgCluster) -> None:
    defaults = {
        "b": "box DEFAULT '((2,2),(1,1))'",
        "i": "int[] DEFAULT '{1,2}'",
        "t": """text DEFAULT 'a,"b" {c}'""",
        "p": "point DEFAULT '(1,2)'",
        "n": "numeric DEFAULT 1.50",
    }
    publisher.execute("DROP TABLE IF EXISTS missing_vals; CREATE TABLE missing_vals (id int)")
    publisher.execute("INSERT INTO missing_vals VALUES (1)")
    for name, definition in defaults.items():
        publisher.execute(f"ALTER TABLE missing_vals ADD COLUMN {name} {definition}")
    shown = publisher.execute(
        f"SELECT {', '.join(f'{n}::text' for n in defaults)} FROM missing_vals"
    )
    with publisher.connect(row_factory=dict_row) as conn:
        origins = column_origins(conn, TableRef("public", "missing_vals"), [*defaults, "gone"])
    read = {n: origins.columns[n].missing for n in defaults}
    assert read == dict(zip(defaults, shown[0], strict=True))
    assert not origins.columns["gone"].exists and origins.natts == 1 + len(defaults)
