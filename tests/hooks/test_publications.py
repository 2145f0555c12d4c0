"""Publications through the hook: a definition reconciled (created, then unchanged however the
row filter is spelled, then changed with each difference said), the definitions it will not
reconcile refused with the fix before anything is sent, a drop that says whether there was
anything, and publications a task needs named with those that exist."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import DefinitionConflictError, PublicationNotFoundError
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.models.records import PublishedTable
from airflow_pglogrepl.tables import TableRef
from tests.support.databases import Database

PUB = 'Pub "x"; y'
ORDERS, NOTES = TableRef('Sch"; ema', "Or ders"), TableRef("public", "no'tes")


@pytest.fixture
def tables(database: Database) -> Database:
    database.sql(
        'CREATE SCHEMA "Sch""; ema";'
        'CREATE TABLE "Sch""; ema"."Or ders" (id int PRIMARY KEY, v int, w text);'
        'CREATE TABLE "no\'tes" (id int PRIMARY KEY, body text)'
    )
    return database


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"publish": ["insert", "upsert"]}, "publish must be a non-empty subset"),
        ({"publish": []}, "publish must be a non-empty subset"),
        ({"all_tables": True, "tables": [PublishedTable(ORDERS)]}, "give a table list, or"),
        ({}, "give a table list, or all_tables=True without tables"),
    ],
)
def test_a_definition_that_makes_no_sense_is_refused_before_connecting(
    options: dict[str, object], refused: str
) -> None:
    hook = PgLogicalReplicationHook(postgres_conn_id="publications_no_such_connection")
    with pytest.raises(ValueError, match=refused):
        hook.ensure_publication(PUB, **options)  # type: ignore[arg-type]


def test_created_then_unchanged_however_spelled_then_changed_with_each_difference(
    tables: Database,
) -> None:
    hook = tables.hook
    orders = PublishedTable(ORDERS, columns=("id", "v"), row_filter="v > 1")
    made = hook.ensure_publication(PUB, tables=[orders])
    assert (made.action, made.details) == ("created", (f"+ {ORDERS}",))
    respelled = PublishedTable(ORDERS, columns=("id", "v"), row_filter="(V>1)")
    assert hook.ensure_publication(PUB, tables=[respelled]).action == "unchanged"
    changed = hook.ensure_publication(
        PUB, tables=[PublishedTable(ORDERS, columns=("id", "w")), PublishedTable(NOTES)],
        publish=["insert"], via_root=True,
    )  # fmt: skip
    assert changed.action == "changed"
    assert changed.details == (
        f"+ {NOTES}",
        f"~ {ORDERS}: columns id,v -> id,w, filter '(v > 1)' -> None",
        "publish insert,update,delete,truncate -> insert",
        "publish_via_partition_root False -> True",
    )
    assert set(hook.publication_tables(PUB) or []) == {NOTES, ORDERS}
    dropped = hook.ensure_publication(PUB, tables=[PublishedTable(NOTES)], publish=["insert"],
                                      via_root=True)  # fmt: skip
    assert dropped.details == (f"- {ORDERS}",)


def test_definitions_it_does_not_manage_are_refused_with_the_fix(tables: Database) -> None:
    hook = tables.hook
    hook.ensure_publication("every", all_tables=True)
    with pytest.raises(DefinitionConflictError, match="is FOR ALL TABLES while this task asks"):
        hook.ensure_publication("every", tables=[PublishedTable(NOTES)])
    hook.ensure_publication("listed", tables=[PublishedTable(NOTES)])
    with pytest.raises(DefinitionConflictError, match=r"publishes a table list \(1 tables\)"):
        hook.ensure_publication("listed", all_tables=True)
    tables.sql('CREATE PUBLICATION "by schema" FOR TABLES IN SCHEMA "Sch""; ema"')
    with pytest.raises(DefinitionConflictError, match='publishes whole schemas \\(Sch"; ema\\)'):
        hook.ensure_publication("by schema", tables=[PublishedTable(NOTES)])
    assert hook.publication_tables("listed") == [NOTES]  # nothing changed by the refusals


def test_a_drop_says_whether_there_was_anything(tables: Database) -> None:
    hook = tables.hook
    hook.ensure_publication(PUB, tables=[PublishedTable(NOTES)])
    assert hook.drop_publication(PUB) is True
    assert hook.get_publication(PUB) is None
    assert hook.drop_publication(PUB) is False


def test_publications_a_task_needs_are_named_with_those_that_exist(tables: Database) -> None:
    hook = tables.hook
    hook.ensure_publication("orders_pub", tables=[PublishedTable(ORDERS)])
    hook.require_publications(["orders_pub"], consequence="nothing was drained")
    assert hook.missing_publications(["orders_pub", "order_pub"]) == ["order_pub"]
    with pytest.raises(PublicationNotFoundError) as caught:
        hook.require_publications(["order_pub"], slot="s", consequence="nothing was drained")
    text = str(caught.value)
    assert caught.value.names == ["order_pub"] and caught.value.existing == ["orders_pub"]
    assert "'orders_pub'" in text and "nothing was drained" in text
    assert f"{tables.cluster.host}:{tables.cluster.port}/{tables.name}" in text
