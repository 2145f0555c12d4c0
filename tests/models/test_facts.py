"""The catalog's facts as plain records: why an index cannot be the replica identity (in the
order and the words PostgreSQL's own check gives), a relation's kind in a DBA's words, a
table's primary key, identity index and columns, and the capacity the existing subscriptions
hold on the subscriber."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.models.facts import IndexFacts, SubscriberUsage
from airflow_pglogrepl.tables import TableRef
from tests.support.preflight import col, idx, pk, table


def test_a_unique_not_null_index_is_usable() -> None:
    index = idx("t_a_key", "a")
    assert index.unusable_reason is None and index.usable


@pytest.mark.parametrize(
    ("index", "reason"),
    [
        (idx("i", "a", unique=False), "it is not unique"),
        (idx("i", "a", partial=True), "it is a partial index (it has a WHERE clause)"),
        (idx("i", "a", expression=True), "it indexes an expression"),
        (idx("i", "a", immediate=False), "it is deferrable"),
        (idx("i", "a", valid=False),
         "it is invalid (a failed CREATE INDEX CONCURRENTLY); REINDEX or drop it"),
        (idx("i", "a", "b", nullable=("a",)), 'column "a" is nullable'),
        (idx("i", "a", "b", nullable=("a", "b")), 'columns "a", "b" are nullable'),
    ],
)  # fmt: skip
def test_an_unusable_index_says_why_in_postgresqls_words(index: IndexFacts, reason: str) -> None:
    assert index.unusable_reason == reason
    assert not index.usable


def test_the_first_reason_postgresql_checks_is_the_one_given() -> None:
    """ALTER TABLE ... REPLICA IDENTITY USING INDEX checks uniqueness, then the predicate, then
    expressions, then deferrability, validity, and nullability last."""
    everything = idx("i", "a", nullable=("a",), unique=False, partial=True, expression=True,
                     immediate=False, valid=False)  # fmt: skip
    assert everything.unusable_reason == "it is not unique"
    invalid = idx("i", "a", nullable=("a",), valid=False).unusable_reason
    assert invalid is not None and invalid.startswith("it is invalid")


@pytest.mark.parametrize(
    ("relkind", "kind"),
    [("r", "table"), ("p", "partitioned table"), ("v", "view"), ("m", "materialized view"),
     ("f", "foreign table"), ("S", "sequence"), ("x", "relation of kind 'x'")],
)  # fmt: skip
def test_a_relations_kind_is_named_in_a_dbas_words(relkind: str, kind: str) -> None:
    assert table("t", relkind=relkind).kind == kind


def test_a_table_finds_its_primary_key_identity_index_and_columns() -> None:
    key, marked = pk("t_pkey", "id"), idx("t_code_key", "code", replica_identity=True)
    facts = table("t", col("id", not_null=True), col("Code"), col("code"),
                  indexes=(marked, key), ri="i")  # fmt: skip
    assert facts.table == TableRef("public", "t")
    assert facts.primary_key is key and facts.identity_index is marked
    found = facts.column("code")
    assert found is not None and found.name == "code"  # exact, as stored: not "Code"
    assert facts.column("CODE") is None
    bare = table("u", col("v"))
    assert bare.primary_key is None and bare.identity_index is None


def test_the_subscribers_workers_and_origins_in_use() -> None:
    """An enabled subscription keeps an apply worker, any subscription an origin; a running
    table-sync worker holds both."""
    usage = SubscriberUsage(subscriptions=5, enabled_subscriptions=3, extra_workers_running=2)
    assert usage.logical_workers_in_use == 5
    assert usage.origins_in_use == 7
