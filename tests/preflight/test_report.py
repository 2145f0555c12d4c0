"""The preflight report lists every problem with its fix, shows applied fixes, and serialises."""

from __future__ import annotations

import json

from airflow_pglogrepl.preflight import PreflightFailedError, evaluate
from airflow_pglogrepl.preflight.report import AppliedFix
from airflow_pglogrepl.tables import TableRef
from tests.support.preflight import col, inspection, keyed, table

# -- the report -------------------------------------------------------------------------------


def test_report_lists_every_problem_with_its_fix_and_serialises() -> None:
    hostile = TableRef('Sales "EU"', "Q1 report ü")
    pub = [
        table(hostile, col("a")),
        keyed("fine"),
        table("full", col("a"), ri="f"),
    ]
    report = evaluate(inspection(pub, [pub[1], pub[2]], publication="orders_pub"))
    assert not report.ok
    text = report.summary()
    assert text.startswith(
        "Replication preflight for publication 'orders_pub' (3 tables, 1 planned subscription): "
        "2 problems block replication, 1 warning."
    )
    assert str(hostile) == '"Sales ""EU"""."Q1 report ü"'
    for finding in report.findings:
        assert f"{finding.table}: {finding.message} Fix: {finding.fix}" in text
    value = report.to_dict()
    assert json.loads(json.dumps(value)) == value
    assert set(value) == {
        "ok",
        "publication",
        "planned_subscriptions",
        "tables",
        "problems",
        "warnings",
        "capacity",
        "fixes_applied",
        "summary",
    }
    assert [p["check"] for p in value["problems"]] == [
        "identity_no_key",
        "table_missing_on_subscriber",
    ]
    assert value["problems"][0]["table"] == str(hostile)
    assert value["tables"][str(hostile)]["problems"] == [
        "identity_no_key",
        "table_missing_on_subscriber",
    ]
    assert value["tables"]["public.full"]["warnings"] == ["identity_full"]


def test_report_shows_applied_fixes_and_passes_with_warnings_only() -> None:
    report = evaluate(
        inspection([table("t", col("a"), ri="f")]),
        fixes_applied=[
            AppliedFix(
                TableRef("public", "t"),
                "ALTER TABLE public.t REPLICA IDENTITY FULL",
                "no_key",
                "full",
            )
        ],
    )
    assert report.ok
    assert "nothing blocks replication, 1 warning." in report.summary()
    assert (
        "public.t: no_key -> full (ALTER TABLE public.t REPLICA IDENTITY FULL)" in report.summary()
    )
    error = PreflightFailedError(report, warnings_fail=True)
    assert str(error).startswith("Warnings fail this check (fail_on_warnings=True).")
