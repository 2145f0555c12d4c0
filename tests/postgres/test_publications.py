"""The publication statements on a live server, every name hostile: created with a column list
and a row filter, read back as the server normalised them, its tables and published columns,
changed, and dropped; a row filter that would stack a second statement is refused."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from airflow_pglogrepl.models.records import PublishedTable
from airflow_pglogrepl.postgres import publications
from airflow_pglogrepl.postgres.connect import run_ddl
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster

pytestmark = pytest.mark.pgversion  # the catalogs of publications change between majors
_dbs = itertools.count(1)
PUB = 'Pub "x"; y'
ORDERS = TableRef('Sch"; ema', "Or ders")
NOTES = TableRef("public", "no'tes")
EVERYTHING = publications.options(publications.PUBLISH_OPERATIONS, False)


@pytest.fixture
def conn(publisher: PgCluster) -> Iterator[Any]:
    """A database named like an injection, with two tables of hostile names."""
    db = f"pg_pub {next(_dbs)}; '\""
    publisher.create_database(db)
    with publisher.connect(db, row_factory=dict_row) as c:
        c.execute('CREATE SCHEMA "Sch""; ema"')
        c.execute('CREATE TABLE "Sch""; ema"."Or ders" (id int PRIMARY KEY, "so""rt" text, v int)')
        c.execute('CREATE TABLE "no\'tes" (id int PRIMARY KEY, body text)')
        yield c


def test_created_read_back_as_the_server_normalised_it(conn: Any) -> None:
    assert publications.read_publication(conn, PUB) is None
    assert publications.publication_tables(conn, PUB) is None
    assert not publications.exists(conn, PUB)
    publications.read_literals_as_checked(conn)
    orders = PublishedTable(ORDERS, columns=("id", 'so"rt'), row_filter="id > 10 AND 'a;' <> ''")
    run_ddl(conn, publications.create_statement(PUB, [orders], False, EVERYTHING))

    found = publications.read_publication(conn, PUB)
    assert found is not None and publications.exists(conn, PUB)
    assert (found.name, found.all_tables, found.via_root, found.schemas) == (PUB, False, False, ())
    assert found.publish == publications.PUBLISH_OPERATIONS
    (table,) = found.tables
    assert table.table == ORDERS and table.columns == ("id", 'so"rt')
    assert table.row_filter == "((id > 10) AND ('a;'::text <> ''::text))"  # pg_get_expr's text
    assert publications.publication_tables(conn, PUB) == [ORDERS]
    # only the published columns, in column order, with their types
    assert publications.published_columns(conn, [PUB]) == {
        ORDERS: [("id", "integer", 23, -1), ('so"rt', "text", 25, -1)]
    }
    assert publications.database_name(conn).startswith("pg_pub ")


def test_changed_to_other_tables_and_options_then_dropped(conn: Any) -> None:
    run_ddl(conn, publications.create_statement(PUB, [PublishedTable(ORDERS)], False, EVERYTHING))
    run_ddl(conn, publications.set_tables_statement(PUB, [PublishedTable(NOTES)]))
    run_ddl(conn, publications.set_options_statement(PUB, publications.options(["insert"], True)))
    found = publications.read_publication(conn, PUB)
    assert found is not None
    assert [t.table for t in found.tables] == [NOTES] and found.tables[0].columns is None
    assert (found.publish, found.via_root) == (("insert",), True)

    run_ddl(conn, publications.drop_statement(PUB, missing_ok=False))
    assert not publications.exists(conn, PUB)
    run_ddl(conn, publications.drop_statement(PUB, missing_ok=True))  # gone already: no error
    with pytest.raises(psycopg.errors.UndefinedObject):
        run_ddl(conn, publications.drop_statement(PUB, missing_ok=False))


def test_all_tables_and_schemas_are_resolved_by_the_server(conn: Any) -> None:
    run_ddl(conn, publications.create_statement("every", [], True, EVERYTHING))
    assert set(publications.publication_tables(conn, "every") or []) == {NOTES, ORDERS}
    found = publications.read_publication(conn, "every")
    assert found is not None and found.all_tables and found.tables == ()

    conn.execute('CREATE PUBLICATION "by schema" FOR TABLES IN SCHEMA "Sch""; ema"')
    found = publications.read_publication(conn, "by schema")
    assert found is not None and found.schemas == ('Sch"; ema',) and found.tables == ()
    assert publications.publication_tables(conn, "by schema") == [ORDERS]


def test_a_row_filter_that_would_stack_a_statement_is_refused(conn: Any) -> None:
    stacked = PublishedTable(NOTES, row_filter='true); DROP TABLE "no\'tes"; --')
    with pytest.raises(ValueError, match="no'tes"):
        publications.create_statement(PUB, [stacked], False, EVERYTHING)
    assert conn.execute('SELECT count(*) AS n FROM "no\'tes"').fetchone()["n"] == 0
