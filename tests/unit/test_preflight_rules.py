"""Preflight rules on hand-built catalog facts: identity classes, sizing, schema, the report."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_pglogrepl.hooks.records import ServerFacts
from airflow_pglogrepl.preflight import (
    Check,
    FixMode,
    IdentityClass,
    IdentityFix,
    PreflightFailedError,
    Severity,
    evaluate,
)
from airflow_pglogrepl.preflight.facts import (
    IndexFacts,
    Inspection,
    PublisherUsage,
    RoleFacts,
    SideFacts,
    SubscriberUsage,
    TableFacts,
)
from airflow_pglogrepl.preflight.identity import assess, best_unique_index, plan_fix
from airflow_pglogrepl.preflight.report import AppliedFix, PreflightReport
from airflow_pglogrepl.preflight.sizing import demand
from airflow_pglogrepl.tables import Column, TableRef

# -- builders ---------------------------------------------------------------------------------


def col(name: str, type_: str = "integer", *, not_null: bool = False, **kw: Any) -> Column:
    return Column(name=name, type=type_, not_null=not_null, **kw)


def idx(name: str, *columns: str, nullable: tuple[str, ...] = (), **kw: Any) -> IndexFacts:
    return IndexFacts(name=name, columns=columns, nullable_columns=nullable, **kw)


def pk(name: str, *columns: str) -> IndexFacts:
    return idx(name, *columns, primary=True)


def table(
    name: str | TableRef,
    *columns: Column,
    indexes: tuple[IndexFacts, ...] = (),
    ri: str = "d",
    relkind: str = "r",
    **kw: Any,
) -> TableFacts:
    return TableFacts(
        table=TableRef.parse(name),
        relkind=relkind,
        replica_identity=ri,
        columns=columns,
        indexes=indexes,
        **kw,
    )


def keyed(name: str, **kw: Any) -> TableFacts:
    """``id integer PRIMARY KEY, v text``."""
    return table(
        name, col("id", not_null=True), col("v", "text"), indexes=(pk(f"{name}_pkey", "id"),), **kw
    )


def server(**overrides: Any) -> ServerFacts:
    values: dict[str, Any] = {
        "version_num": 150000,
        "version": "15.0",
        "in_recovery": False,
        "wal_level": "logical",
        "max_replication_slots": 10,
        "max_wal_senders": 10,
        "max_logical_replication_workers": 4,
        "max_worker_processes": 8,
        "max_sync_workers_per_subscription": 2,
        "logical_decoding_work_mem": 64 << 20,
        "max_slot_wal_keep_size": None,
    }
    values.update(overrides)
    return ServerFacts(**values)


SUPERUSER = RoleFacts("postgres", superuser=True, replication=True)
NO_SLOTS_USED = PublisherUsage(0, 0)
NO_WORKERS_USED = SubscriberUsage(0, 0, 0)


def inspection(
    pub: list[TableFacts],
    sub: list[TableFacts] | None = None,
    *,
    tables: list[str] | None = None,
    pub_server: ServerFacts | None = None,
    sub_server: ServerFacts | None = None,
    role: RoleFacts = SUPERUSER,
    pub_usage: PublisherUsage = NO_SLOTS_USED,
    sub_usage: SubscriberUsage = NO_WORKERS_USED,
    planned: int = 1,
    publication: str | None = None,
    publication_exists: bool = True,
) -> Inspection:
    """Publisher ``pub`` and subscriber ``sub`` (default: an identical copy of ``pub``)."""
    sub = pub if sub is None else sub
    refs = (
        [TableRef.parse(t) for t in tables]
        if tables is not None
        else [t.table for t in pub if not any(t.table in p.leaf_partitions for p in pub)]
    )
    return Inspection(
        tables=tuple(refs),
        publisher=SideFacts(
            server=pub_server or server(),
            tables={t.table: t for t in pub},
            role=role,
            publisher_usage=pub_usage,
        ),
        subscriber=SideFacts(
            server=sub_server or server(),
            tables={t.table: t for t in sub},
            subscriber_usage=sub_usage,
        ),
        planned_subscriptions=planned,
        publication=publication,
        publication_exists=publication_exists,
    )


def checks_by_table(report: PreflightReport) -> dict[str | None, set[str]]:
    out: dict[str | None, set[str]] = {}
    for f in report.findings:
        out.setdefault(None if f.table is None else str(f.table), set()).add(f.check.value)
    return out


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


# -- sizing -----------------------------------------------------------------------------------


def test_demand_caps_sync_workers_at_the_table_count() -> None:
    one = inspection([keyed("a")])
    assert demand(one).total == 2  # 1 apply + min(2 sync, 1 table)
    three = inspection([keyed("a"), keyed("b"), keyed("c")], planned=3)
    assert demand(three).total == 9  # 3 x (1 + 2)


def test_publisher_capacity_counts_what_is_in_use() -> None:
    report = evaluate(
        inspection(
            [keyed("a"), keyed("b")],
            planned=2,
            pub_usage=PublisherUsage(slots_in_use=8, wal_senders_in_use=3),
        )
    )
    by_check = {f.check: f for f in report.problems}
    slots = by_check[Check.REPLICATION_SLOTS]
    assert "max_replication_slots is 10 with 8 slots" in slots.message
    assert "2 free; 6 needed" in slots.message
    assert "raise max_replication_slots by 4 to 14" in slots.fix
    assert "restart" in slots.fix
    assert Check.WAL_SENDERS not in by_check  # 7 free, 6 needed
    assert report.capacity["publisher"]["replication_slots_in_use"] == 8
    assert report.capacity["publisher"]["needed"] == 6


def test_subscriber_capacity_and_worker_processes() -> None:
    report = evaluate(
        inspection(
            [keyed("a"), keyed("b")],
            sub_server=server(
                max_logical_replication_workers=8, max_worker_processes=8, max_replication_slots=8
            ),
            sub_usage=SubscriberUsage(
                subscriptions=3, enabled_subscriptions=2, extra_workers_running=4
            ),
        )
    )
    by_check = {f.check: f for f in report.problems}
    workers = by_check[Check.LOGICAL_WORKERS]
    assert "max_logical_replication_workers is 8 with 6 workers" in workers.message
    assert "raise max_logical_replication_workers by 1 to 9" in workers.fix
    assert "max_worker_processes (8) must then be raised to at least 10" in workers.fix
    processes = by_check[Check.WORKER_PROCESSES]
    assert "raise max_worker_processes by 1 to 9" in processes.fix
    origins = by_check[Check.REPLICATION_ORIGINS]
    assert "max_replication_slots is 8 with 7 replication origins" in origins.message
    assert "leaving 1 free; 3 needed" in origins.message
    assert "raise max_replication_slots by 2 to 10" in origins.fix


def test_origins_are_counted_against_their_own_setting_from_postgresql_18() -> None:
    """18 caps origins by max_active_replication_origins (default 10), no longer by
    max_replication_slots. Before: no check at all on 18, so 20 planned subscriptions on a
    subscriber that can run 10 passed as ready."""
    fits = evaluate(
        inspection(
            [keyed("a")],
            sub_server=server(
                version_num=180000, max_replication_slots=0, max_active_replication_origins=10
            ),
        )
    )
    assert Check.REPLICATION_ORIGINS.value not in fits.checks()
    report = evaluate(inspection([keyed("a")], planned=20, sub_server=server(
        version_num=180000, max_replication_slots=100, max_active_replication_origins=10,
        max_logical_replication_workers=100, max_worker_processes=200)))  # fmt: skip
    origins = next(f for f in report.problems if f.check is Check.REPLICATION_ORIGINS)
    assert origins.message.startswith("max_active_replication_origins is 10")
    assert "max_active_replication_origins" in origins.fix
    assert not report.ok


def test_wal_level_and_role() -> None:
    report = evaluate(
        inspection(
            [keyed("a")],
            pub_server=server(wal_level="replica"),
            role=RoleFacts("app", superuser=False, replication=False),
        )
    )
    assert {Check.WAL_LEVEL.value, Check.REPLICATION_ROLE.value} <= report.checks()
    role = next(f for f in report.problems if f.check is Check.REPLICATION_ROLE)
    assert 'ALTER ROLE "app" REPLICATION' in role.fix
    ok = evaluate(inspection([keyed("a")], role=RoleFacts("r", superuser=False, replication=True)))
    assert ok.ok, ok.summary()


def test_temp_file_limit_is_reported_against_the_biggest_transaction_decoded() -> None:
    unlimited = evaluate(inspection([keyed("a")]))
    assert Check.TEMP_FILE_LIMIT.value not in unlimited.checks()
    limited = evaluate(
        inspection([keyed("a")], pub_server=server(temp_file_limit=1 << 20,
                                                   largest_decoded_transaction=3 << 20))
    )  # fmt: skip
    (finding,) = [f for f in limited.warnings if f.check is Check.TEMP_FILE_LIMIT]
    assert "1048576 bytes" in finding.message and "at least 3145728 bytes" in finding.message
    assert "above it" in finding.message and "temp_file_limit = -1" in finding.fix
    assert limited.ok  # a warning: subscriptions do not peek


def test_an_idle_slot_timeout_is_a_warning_for_drains() -> None:
    """PostgreSQL 18's idle_replication_slot_timeout invalidates a drain's slot between runs
    scheduled further apart than it."""
    assert Check.IDLE_SLOT_TIMEOUT.value not in evaluate(inspection([keyed("a")])).checks()
    report = evaluate(
        inspection([keyed("a")], pub_server=server(idle_replication_slot_timeout_s=3600))
    )
    (finding,) = [f for f in report.warnings if f.check is Check.IDLE_SLOT_TIMEOUT]
    assert "3600 s" in finding.message and "= 0 (off)" in finding.fix
    assert report.ok


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


def test_no_tables() -> None:
    missing = evaluate(inspection([], tables=[], publication="p", publication_exists=False))
    assert [f.check for f in missing.problems] == [Check.PUBLICATION_MISSING]
    empty = evaluate(inspection([], tables=[], publication="p"))
    assert [f.check for f in empty.problems] == [Check.NO_TABLES]
    assert 'ALTER PUBLICATION "p" ADD TABLE' in empty.problems[0].fix
