"""A cutover's sequences through the hook: nothing asked, nothing opened; the sequences behind
a table's columns read and set (and said so in the log); a sequence that is not there is
refused with the fix, not passed over."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.tables import TableRef
from tests.support.databases import Database

T = TableRef('Sch"; ema', "T a'b")


def test_nothing_asked_opens_no_session() -> None:
    hook = PgLogicalReplicationHook(postgres_conn_id="sequences_no_such_connection")
    assert hook.owned_sequences([]) == []  # the connection is not even looked up
    assert hook.sequence_states([]) == {}


def test_a_table_s_sequence_read_and_set(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    database.sql(
        'CREATE SCHEMA "Sch""; ema";'
        'CREATE TABLE "Sch""; ema"."T a\'b" (id bigint GENERATED ALWAYS AS IDENTITY, v text);'
        'INSERT INTO "Sch""; ema"."T a\'b" (v) VALUES (\'a\'), (\'b\')'
    )
    hook = database.hook
    (owned,) = hook.owned_sequences([T])
    assert (owned.table, owned.column, owned.kind) == (T, "id", "identity")
    assert hook.sequence_states([owned.sequence])[owned.sequence].last_value == 2
    assert hook.column_max(T, "id") == 2
    hook.set_sequence(owned.sequence, 500)
    assert hook.sequence_states([owned.sequence])[owned.sequence].last_value == 500
    assert f"setval({owned.sequence}, 500)" in capsys.readouterr().out  # the task log


def test_a_sequence_that_is_not_there_is_refused_with_the_fix(database: Database) -> None:
    absent = TableRef("public", "no_such_seq")
    with pytest.raises(ObjectNotFoundError, match=r"sequence 'public\.no_such_seq' does not exist"):
        database.hook.set_sequence(absent, 5)
    assert database.hook.sequence_states([absent]) == {}
