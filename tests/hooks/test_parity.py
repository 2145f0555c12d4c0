"""The cutover's parity reads through the hook: nothing asked, nothing opened; a table of
hostile names read the same way as its copy, and a difference seen."""

from __future__ import annotations

from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.tables import TableRef
from tests.support.databases import Database

T, COPY = TableRef('Sch"; ema', "T a'b"), TableRef("public", "copy")


def test_no_tables_opens_no_session() -> None:
    hook = PgLogicalReplicationHook(postgres_conn_id="parity_no_such_connection")
    assert hook.table_columns([]) == {}  # the connection is not even looked up


def test_a_table_and_its_copy_read_the_same_until_one_changes(database: Database) -> None:
    database.sql(
        'CREATE SCHEMA "Sch""; ema";'
        'CREATE TABLE "Sch""; ema"."T a\'b" (id int, "v""x" text, g int GENERATED ALWAYS AS'
        " (id + 1) STORED);"
        'INSERT INTO "Sch""; ema"."T a\'b" (id, "v""x") VALUES (1, \'a\'), (2, NULL);'
        'CREATE TABLE copy AS SELECT id, "v""x" FROM "Sch""; ema"."T a\'b"'
    )
    hook = database.hook
    columns = hook.table_columns([T, COPY, TableRef("public", "absent")])
    assert columns == {T: ("id", 'v"x'), COPY: ("id", 'v"x')}  # no generated column
    first = hook.table_checksum(T, columns[T])
    assert first.rows == 2 and first == hook.table_checksum(COPY, columns[COPY])
    database.sql('UPDATE copy SET "v""x" = \'b\' WHERE id = 1')
    assert hook.table_checksum(COPY, columns[COPY]) != first
