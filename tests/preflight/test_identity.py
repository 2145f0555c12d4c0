"""Replica identity on hand-built catalog facts: identity classes, the best index, the fix."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.models.facts import IndexFacts, TableFacts
from airflow_pglogrepl.preflight import Check, FixMode, IdentityClass, IdentityFix, Severity
from airflow_pglogrepl.preflight.identity import assess, best_unique_index, plan_fix
from airflow_pglogrepl.tables import TableRef
from tests.support.preflight import col, idx, keyed, table

# -- replica identity -------------------------------------------------------------------------

NN = (col("a", not_null=True), col("b", not_null=True), col("c", "text"))


@pytest.mark.parametrize(
    ("facts", "cls", "severity", "keys", "fix_has"),
    [
        (keyed("t"), IdentityClass.PRIMARY_KEY, None, ("id",), None),
        (
            table("t", *NN, indexes=(idx("t_a_key", "a", replica_identity=True),), ri="i"),
            IdentityClass.INDEX,
            None,
            ("a",),
            None,
        ),
        (
            table("t", *NN, indexes=(idx("t_ab_key", "a", "b"), idx("t_a_key", "a"))),
            IdentityClass.UNIQUE_INDEX_UNUSED,
            Severity.ERROR,
            (),
            'ALTER TABLE public.t REPLICA IDENTITY USING INDEX "t_a_key"',
        ),
        (
            table("t", col("a"), col("b")),
            IdentityClass.NO_KEY,
            Severity.ERROR,
            (),
            "ALTER TABLE public.t REPLICA IDENTITY FULL",
        ),
        (
            keyed("t", ri="n"),
            IdentityClass.NOTHING,
            Severity.ERROR,
            (),
            "ALTER TABLE public.t REPLICA IDENTITY DEFAULT",
        ),
        (
            table("t", col("v"), indexes=(idx("t_v_key", "v", nullable=("v",)),)),
            IdentityClass.NULLABLE_UNIQUE_INDEX,
            Severity.ERROR,
            (),
            'ALTER TABLE public.t ALTER COLUMN "v" SET NOT NULL',
        ),
        (
            table("t", *NN, indexes=(idx("t_a_key", "a"),), ri="i"),
            IdentityClass.INDEX_MISSING,
            Severity.ERROR,
            (),
            'USING INDEX "t_a_key"',
        ),
        (
            table("t", col("a"), col("b", "text"), ri="f"),
            IdentityClass.FULL,
            Severity.WARNING,
            ("a", "b"),
            "add a primary key",
        ),
        (
            keyed("t", ri="f"),
            IdentityClass.FULL,
            Severity.WARNING,
            ("id", "v"),
            "ALTER TABLE public.t REPLICA IDENTITY DEFAULT",
        ),
    ],
)
def test_identity_classes(
    facts: TableFacts,
    cls: IdentityClass,
    severity: Severity | None,
    keys: tuple[str, ...],
    fix_has: str | None,
) -> None:
    verdict = assess(facts)
    assert verdict.cls is cls
    assert verdict.key_columns == keys
    if severity is None:
        assert verdict.finding is None
    else:
        assert verdict.finding is not None
        _, got, _, fix = verdict.finding
        assert got is severity
        assert fix_has is not None and fix_has in fix


def test_nullable_unique_index_gives_postgresqls_reason() -> None:
    facts = table("t", col("v"), indexes=(idx("t_v_key", "v", nullable=("v",)),))
    finding = assess(facts).finding
    assert finding is not None
    assert finding[0] is Check.IDENTITY_NULLABLE_UNIQUE_INDEX
    assert 'cannot be used as replica identity because column "v" is nullable' in finding[2]


@pytest.mark.parametrize(
    ("index", "reason"),
    [
        (idx("i", "a", partial=True), "partial"),
        (idx("i", "a", expression=True), "expression"),
        (idx("i", "a", immediate=False), "deferrable"),
        (idx("i", "a", valid=False), "invalid"),
    ],
)
def test_unusable_unique_indexes_are_explained(index: IndexFacts, reason: str) -> None:
    verdict = assess(table("t", col("a", not_null=True), indexes=(index,)))
    assert verdict.cls is IdentityClass.NO_KEY
    assert verdict.finding is not None and reason in verdict.finding[2]
    assert verdict.best_index is None


def test_best_index_has_fewest_columns_and_skips_unusable() -> None:
    facts = table(
        "t",
        *NN,
        indexes=(
            idx("z_one", "a", partial=True),
            idx("b_two", "a", "b"),
            idx("y_one", "b"),
            idx("x_null", "c", nullable=("c",)),
        ),
    )
    best = best_unique_index(facts)
    assert best is not None and best.name == "y_one"


@pytest.mark.parametrize(
    ("facts", "mode", "expected"),
    [
        (keyed("t"), FixMode.FULL, None),
        (keyed("t", ri="n"), FixMode.NONE, None),
        (keyed("t", ri="n"), FixMode.INDEX, IdentityFix(TableRef("public", "t"), "default")),
        (keyed("t", ri="f"), FixMode.INDEX, IdentityFix(TableRef("public", "t"), "default")),
        (
            table("t", *NN, indexes=(idx("t_ab", "a", "b"), idx("t_b", "b"))),
            FixMode.INDEX,
            IdentityFix(TableRef("public", "t"), "index", "t_b"),
        ),
        (table("t", col("a")), FixMode.INDEX, None),
        (table("t", col("a")), FixMode.FULL, IdentityFix(TableRef("public", "t"), "full")),
        (
            table("t", col("v"), indexes=(idx("t_v", "v", nullable=("v",)),), ri="n"),
            FixMode.FULL,
            IdentityFix(TableRef("public", "t"), "full"),
        ),
        (table("t", col("a"), ri="f"), FixMode.FULL, None),
        (table("t", col("a"), relkind="p"), FixMode.FULL, None),
    ],
)
def test_plan_fix(facts: TableFacts, mode: FixMode, expected: IdentityFix | None) -> None:
    assert plan_fix(facts, mode) == expected


def test_fix_statement_quotes_hostile_names() -> None:
    fix = IdentityFix(TableRef('Sales "EU"', "q1 ü"), "index", 'idx "x"; drop')
    assert fix.statement == (
        'ALTER TABLE "Sales ""EU"""."q1 ü" REPLICA IDENTITY USING INDEX "idx ""x""; drop"'
    )
    with pytest.raises(ValueError):
        IdentityFix(TableRef("s", "t"), "index")
    with pytest.raises(ValueError):
        IdentityFix(TableRef("s", "t"), "nothing")
