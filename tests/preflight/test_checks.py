"""The preflight's table checks on hand-built catalog facts: kinds, persistence, privileges,
missing tables, partitions judged on each leaf.
"""

from __future__ import annotations

from airflow_pglogrepl.models.facts import RoleFacts
from airflow_pglogrepl.preflight import Check, evaluate
from airflow_pglogrepl.tables import TableRef
from tests.support.preflight import checks_by_table, col, inspection, keyed, table

# -- publisher tables -------------------------------------------------------------------------


def test_kinds_persistence_privileges_and_missing_tables() -> None:
    pub = [
        table("v", col("a"), relkind="v"),
        keyed("unlogged", persistence="u"),
        keyed("temp", persistence="t"),
        keyed("secret", can_select=False, can_use_schema=False),
    ]
    report = evaluate(
        inspection(
            pub,
            tables=["v", "unlogged", "temp", "secret", "nowhere"],
            role=RoleFacts("repl", superuser=False, replication=True),
        )
    )
    assert checks_by_table(report) == {
        "public.v": {"table_kind"},
        "public.unlogged": {"table_not_permanent"},
        "public.temp": {"table_not_permanent"},
        "public.secret": {"select_privilege", "schema_usage"},
        "public.nowhere": {"table_missing_on_publisher"},
    }
    fixes = {(f.check, str(f.table)): f.fix for f in report.problems}
    assert (
        fixes[Check.SELECT_PRIVILEGE, "public.secret"] == 'GRANT SELECT ON public.secret TO "repl"'
    )
    assert fixes[Check.SCHEMA_USAGE, "public.secret"] == 'GRANT USAGE ON SCHEMA "public" TO "repl"'
    assert fixes[Check.TABLE_NOT_PERMANENT, "public.unlogged"] == (
        "ALTER TABLE public.unlogged SET LOGGED (rewrites the table under an exclusive lock)"
    )
    assert report.details[TableRef("public", "nowhere")].kind is None


def test_partition_identity_is_judged_on_each_leaf() -> None:
    parent = table(
        "events",
        col("id", not_null=True),
        relkind="p",
        ri="f",
        leaf_partitions=(TableRef("public", "events_1"), TableRef("public", "events_2")),
    )
    good = keyed("events_1")
    bad = table("events_2", col("id", not_null=True))
    report = evaluate(inspection([parent, good, bad], tables=["events"]))
    assert checks_by_table(report) == {"public.events_2": {"identity_no_key"}}
    finding = report.problems[0]
    assert finding.message.startswith("(partition of public.events)")
    detail = report.to_dict()["tables"]
    assert detail["public.events"]["identity_class"] == "partitioned"
    assert detail["public.events_2"]["partition_of"] == "public.events"
    assert detail["public.events_2"]["problems"] == ["identity_no_key"]


def test_no_tables() -> None:
    missing = evaluate(inspection([], tables=[], publication="p", publication_exists=False))
    assert [f.check for f in missing.problems] == [Check.PUBLICATION_MISSING]
    empty = evaluate(inspection([], tables=[], publication="p"))
    assert [f.check for f in empty.problems] == [Check.NO_TABLES]
    assert 'ALTER PUBLICATION "p" ADD TABLE' in empty.problems[0].fix
