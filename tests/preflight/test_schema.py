"""The subscriber's copy of each table, on hand-built catalog facts."""

from __future__ import annotations

from airflow_pglogrepl.preflight import Check, Severity, evaluate
from airflow_pglogrepl.tables import TableRef
from tests.support.preflight import checks_by_table, col, inspection, keyed, pk, table

# -- subscriber tables ------------------------------------------------------------------------


def test_subscriber_schema_findings() -> None:
    pub = [
        keyed("missing"),
        table(
            "cols",
            col("id", not_null=True),
            col("a", "text"),
            col("b", "bigint"),
            col("g", "integer", generated="s"),
            indexes=(pk("cols_pkey", "id"),),
        ),
        keyed("extra"),
        keyed("types"),
        keyed("gen"),
    ]
    sub = [
        table("cols", col("id", not_null=True), indexes=(pk("cols_pkey", "id"),)),
        table(
            "extra",
            col("id", not_null=True),
            col("v", "text"),
            col("must", not_null=True),
            col("has_default", not_null=True, has_default=True),
            col("ident", "bigint", not_null=True, identity="a"),
            col("nullable"),
            indexes=(pk("extra_pkey", "id"),),
        ),
        table(
            "types", col("id", "bigint", not_null=True), col("v", "text"), indexes=(pk("p", "id"),)
        ),
        table(
            "gen",
            col("id", not_null=True),
            col("v", "text", generated="s"),
            indexes=(pk("p", "id"),),
        ),
    ]
    report = evaluate(inspection(pub, sub, tables=["missing", "cols", "extra", "types", "gen"]))
    assert checks_by_table(report) == {
        "public.missing": {"table_missing_on_subscriber"},
        "public.cols": {"column_missing"},
        "public.extra": {"not_null_without_default"},
        "public.types": {"column_type_differs"},
        "public.gen": {"column_generated_on_subscriber"},
    }
    by_check = {f.check: f for f in report.findings}
    missing = by_check[Check.COLUMN_MISSING]
    assert '"a", "b"' in missing.message and '"g"' not in missing.message  # generated: not sent
    assert (
        missing.fix
        == 'on the subscriber: ALTER TABLE public.cols ADD COLUMN "a" text, ADD COLUMN "b" bigint'
    )
    stuck = by_check[Check.NOT_NULL_WITHOUT_DEFAULT]
    assert '"must"' in stuck.message
    assert not any(name in stuck.message for name in ('"has_default"', '"ident"', '"nullable"'))
    assert 'ALTER COLUMN "must" SET DEFAULT' in stuck.fix
    assert by_check[Check.COLUMN_TYPE_DIFFERS].severity is Severity.WARNING
    assert report.details[TableRef("public", "missing")].on_subscriber is False


def test_subscriber_key_must_be_covered_by_the_published_key() -> None:
    pub = [keyed("nokey_sub"), keyed("wider"), keyed("narrower", ri="f"), keyed("same")]
    sub = [
        table("nokey_sub", col("id", not_null=True), col("v", "text")),
        table(
            "wider",
            col("id", not_null=True),
            col("v", "text", not_null=True),
            indexes=(pk("w", "id", "v"),),
        ),
        table("narrower", col("id", not_null=True), col("v", "text"), indexes=(pk("n", "id"),)),
        keyed("same"),
    ]
    report = evaluate(inspection(pub, sub))
    assert checks_by_table(report) == {
        "public.nokey_sub": {"subscriber_key_mismatch"},
        "public.wider": {"subscriber_key_mismatch"},
        "public.narrower": {"identity_full"},
    }
    fixes = {str(f.table): f.fix for f in report.problems}
    assert 'ALTER TABLE public.nokey_sub ADD PRIMARY KEY ("id")' in fixes["public.nokey_sub"]


def test_full_identity_with_defaulted_subscriber_columns_is_an_error() -> None:
    pub = [table("f", col("a"), col("b", "text"), ri="f")]
    sub = [table("f", col("a"), col("b", "text"), col("loaded_at", "timestamp", has_default=True))]
    report = evaluate(inspection(pub, sub))
    assert Check.FULL_IDENTITY_EXTRA_COLUMNS in {f.check for f in report.problems}
    fine = evaluate(inspection(pub, [table("f", col("a"), col("b", "text"), col("note", "text"))]))
    assert fine.ok and {f.check for f in fine.warnings} == {Check.IDENTITY_FULL}
