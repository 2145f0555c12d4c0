"""Run every preflight rule over an ``Inspection`` and assemble the ``PreflightReport``."""

from __future__ import annotations

from collections.abc import Iterable

from airflow_pglogrepl.models.facts import (
    IDENTITY_NAMES,
    PERSISTENCE_NAMES,
    PUBLISHABLE_RELKINDS,
    Inspection,
    RoleFacts,
    TableFacts,
)
from airflow_pglogrepl.preflight import identity, schema, sizing
from airflow_pglogrepl.preflight._text import ident
from airflow_pglogrepl.preflight.report import (
    AppliedFix,
    Check,
    Finding,
    PreflightReport,
    Severity,
    Side,
    TableDetail,
)
from airflow_pglogrepl.tables import TableRef


def evaluate(
    inspection: Inspection,
    *,
    fixes_applied: Iterable[AppliedFix] = (),
    fix_failures: Iterable[Finding] = (),
) -> PreflightReport:
    """Judge ``inspection``: capacity, role, tables, replica identities, subscriber schemas."""
    report = PreflightReport(
        publication=inspection.publication,
        tables=list(inspection.tables),
        planned_subscriptions=inspection.planned_subscriptions,
        capacity=sizing.capacity(inspection),
        fixes_applied=list(fixes_applied),
    )
    findings = report.findings
    findings += sizing.check_publisher(inspection)
    if inspection.publisher.role is not None:
        findings += _role(inspection.publisher.role)
    findings += sizing.check_subscriber(inspection)
    if not inspection.tables:
        findings.append(_no_tables(inspection))
    for table in inspection.tables:
        findings += _table(inspection, table, report.details)
    findings += fix_failures
    return report


def fix_failed(fix: identity.IdentityFix, reason: str, remedy: str) -> Finding:
    """The finding for a replica identity change the server refused."""
    return Finding(
        Check.IDENTITY_FIX_FAILED,
        Severity.WARNING,
        Side.PUBLISHER,
        f"could not change the replica identity ({fix.statement}): {reason}.",
        remedy,
        fix.table,
    )


def _no_tables(inspection: Inspection) -> Finding:
    if inspection.publication and not inspection.publication_exists:
        return Finding(
            Check.PUBLICATION_MISSING,
            Severity.ERROR,
            Side.PUBLISHER,
            f"publication {inspection.publication!r} does not exist on the publisher, and no "
            f"tables were given: there is nothing to check.",
            "create the publication first, or pass tables= (the tables it will publish)",
        )
    if inspection.publication:
        return Finding(
            Check.NO_TABLES,
            Severity.ERROR,
            Side.PUBLISHER,
            f"publication {inspection.publication!r} publishes no tables, and no tables were "
            f"given: there is nothing to replicate.",
            f"add tables (ALTER PUBLICATION {ident(inspection.publication)} ADD TABLE ...) or "
            f"pass tables=",
        )
    return Finding(
        Check.NO_TABLES,
        Severity.ERROR,
        Side.PUBLISHER,
        "no tables to check.",
        "pass tables= or the name of an existing publication",
    )


def _role(role: RoleFacts) -> list[Finding]:
    if role.superuser or role.replication:
        return []
    return [
        Finding(
            Check.REPLICATION_ROLE,
            Severity.ERROR,
            Side.PUBLISHER,
            f"role {role.name!r} has neither REPLICATION nor SUPERUSER: a subscription that "
            f"connects as it cannot start replication.",
            f"ALTER ROLE {ident(role.name)} REPLICATION (as a superuser), or give the "
            f"subscription and this check a role that has it",
        )
    ]


def _table(
    inspection: Inspection, table: TableRef, details: dict[TableRef, TableDetail]
) -> list[Finding]:
    pub = inspection.publisher.tables.get(table)
    detail = details.setdefault(table, TableDetail(table))
    if pub is None:
        return [
            Finding(
                Check.TABLE_MISSING_ON_PUBLISHER,
                Severity.ERROR,
                Side.PUBLISHER,
                "does not exist on the publisher (a quoted name is case-sensitive: "
                '"Orders" is not orders).',
                "correct the name, or create the table",
                table,
            )
        ]
    detail.kind = pub.kind
    detail.persistence = PERSISTENCE_NAMES.get(pub.persistence, pub.persistence)
    detail.replica_identity = IDENTITY_NAMES.get(pub.replica_identity, pub.replica_identity)
    if pub.relkind not in PUBLISHABLE_RELKINDS:
        return [
            Finding(
                Check.TABLE_KIND,
                Severity.ERROR,
                Side.PUBLISHER,
                f"is a {pub.kind}; only tables and partitioned tables can be published.",
                "publish the table(s) it reads from instead, or replace it with a table",
                table,
            )
        ]
    findings = _persistence(pub) + _privileges(inspection, pub)
    verdict: identity.IdentityAssessment | None = None
    if pub.relkind == "p":
        detail.identity_class = identity.IdentityClass.PARTITIONED.value
        for leaf in pub.leaf_partitions:
            findings += _leaf(inspection, leaf, table, details)
    else:
        verdict = identity.assess(pub)
        findings += _identity_findings(verdict, detail)
    sub = inspection.subscriber.tables.get(table)
    detail.on_subscriber = sub is not None
    findings += schema.compare(pub, sub, verdict)
    return findings


def _leaf(
    inspection: Inspection,
    leaf: TableRef,
    parent: TableRef,
    details: dict[TableRef, TableDetail],
) -> list[Finding]:
    """A leaf partition: UPDATE and DELETE check its own replica identity, not the parent's."""
    facts = inspection.publisher.tables.get(leaf)
    if facts is None:  # dropped or detached between the two catalog reads
        return []
    detail = details.setdefault(leaf, TableDetail(leaf, partition_of=parent))
    detail.partition_of = parent
    detail.kind = facts.kind
    detail.persistence = PERSISTENCE_NAMES.get(facts.persistence, facts.persistence)
    detail.replica_identity = IDENTITY_NAMES.get(facts.replica_identity, facts.replica_identity)
    findings = _identity_findings(identity.assess(facts), detail)
    return [
        Finding(f.check, f.severity, f.side, f"(partition of {parent}) {f.message}", f.fix, leaf)
        for f in findings
    ]


def _identity_findings(verdict: identity.IdentityAssessment, detail: TableDetail) -> list[Finding]:
    detail.identity_class = verdict.cls.value
    detail.identity_columns = verdict.key_columns
    if verdict.finding is None:
        return []
    check, severity, message, fix = verdict.finding
    return [Finding(check, severity, Side.PUBLISHER, message, fix, verdict.table)]


def _persistence(pub: TableFacts) -> list[Finding]:
    if pub.persistence == "u":
        return [
            Finding(
                Check.TABLE_NOT_PERMANENT,
                Severity.ERROR,
                Side.PUBLISHER,
                "is UNLOGGED: its changes are not written to WAL, so they cannot be published.",
                f"ALTER TABLE {pub.table} SET LOGGED (rewrites the table under an exclusive lock)",
                pub.table,
            )
        ]
    if pub.persistence == "t":
        return [
            Finding(
                Check.TABLE_NOT_PERMANENT,
                Severity.ERROR,
                Side.PUBLISHER,
                "is a temporary table; it lives only in one session and cannot be published.",
                "replicate a permanent table instead",
                pub.table,
            )
        ]
    return []


def _privileges(inspection: Inspection, pub: TableFacts) -> list[Finding]:
    role = inspection.publisher.role
    who = ident(role.name) if role is not None else "<replication role>"
    findings = []
    if not pub.can_use_schema:
        findings.append(
            Finding(
                Check.SCHEMA_USAGE,
                Severity.ERROR,
                Side.PUBLISHER,
                f"the connecting role lacks USAGE on schema {ident(pub.table.schema)}, so the "
                f"initial copy cannot read the table.",
                f"GRANT USAGE ON SCHEMA {ident(pub.table.schema)} TO {who}",
                pub.table,
            )
        )
    if not pub.can_select:
        findings.append(
            Finding(
                Check.SELECT_PRIVILEGE,
                Severity.ERROR,
                Side.PUBLISHER,
                "the connecting role lacks SELECT on it, so the subscription's initial copy fails.",
                f"GRANT SELECT ON {pub.table} TO {who}",
                pub.table,
            )
        )
    return findings
