"""The subscriber's copy of each table: present, every published column there, writable rows.

The subscriber matches tables by schema-qualified name and columns by name (order does not
matter). It may have extra columns, but one that is NOT NULL without a default makes the copy
and the first replicated INSERT fail. Column types need only compatible text forms, so a type
difference is a warning. UPDATE and DELETE find the subscriber's row through its own primary key
or identity index, whose columns must all be among the key columns the publisher sends.
See https://www.postgresql.org/docs/15/logical-replication-restrictions.html
"""

from __future__ import annotations

from airflow_pglogrepl.models.facts import PUBLISHABLE_RELKINDS, TableFacts
from airflow_pglogrepl.preflight._text import ident, idents
from airflow_pglogrepl.preflight.identity import IdentityAssessment, IdentityClass
from airflow_pglogrepl.preflight.report import Check, Finding, Severity, Side
from airflow_pglogrepl.tables import Column


def replicated_columns(table: TableFacts) -> list[Column]:
    """The publisher's columns a subscription receives (generated columns are not sent)."""
    return [c for c in table.columns if not c.generated]


def subscriber_key(table: TableFacts) -> tuple[str, ...] | None:
    """Columns the subscriber uses to find a row: its identity index, else its primary key."""
    if table.replica_identity == "i" and table.identity_index is not None:
        return table.identity_index.columns
    pk = table.primary_key
    return pk.columns if pk is not None else None


def _finding(check: Check, severity: Severity, pub: TableFacts, msg: str, fix: str) -> Finding:
    return Finding(check, severity, Side.SUBSCRIBER, msg, fix, pub.table)


def compare(
    pub: TableFacts, sub: TableFacts | None, identity: IdentityAssessment | None
) -> list[Finding]:
    """Findings about the subscriber's copy of the published table ``pub``."""
    t = pub.table
    if sub is None:
        return [
            _finding(
                Check.TABLE_MISSING_ON_SUBSCRIBER,
                Severity.ERROR,
                pub,
                "does not exist on the subscriber; creating or refreshing the subscription fails "
                "until it does (tables are matched by schema-qualified name).",
                f"create it on the subscriber with the publisher's definition, for example "
                f"pg_dump --schema-only --table='{t}' on the publisher's database and run the "
                f"output on the subscriber's",
            )
        ]
    if sub.relkind not in PUBLISHABLE_RELKINDS:
        return [
            _finding(
                Check.SUBSCRIBER_TABLE_KIND,
                Severity.ERROR,
                pub,
                f"is a {sub.kind} on the subscriber; only a table or partitioned table can "
                f"receive replicated rows.",
                f"replace the subscriber's {sub.kind} {t} with a table of the same columns",
            )
        ]
    sent = replicated_columns(pub)
    sent_names = {c.name for c in sent}
    extra = [c for c in sub.columns if c.name not in sent_names]
    findings = _sent_column_findings(pub, sub, sent)
    findings += _extra_column_findings(pub, extra)
    findings += _key_findings(pub, sub, identity, extra)
    return findings


def _sent_column_findings(pub: TableFacts, sub: TableFacts, sent: list[Column]) -> list[Finding]:
    """Can every column the publisher sends land on the subscriber (present, not generated,
    of a type its text converts to)?"""
    t = pub.table
    findings: list[Finding] = []
    missing = [c for c in sent if sub.column(c.name) is None]
    if missing:
        adds = ", ".join(f"ADD COLUMN {ident(c.name)} {c.type}" for c in missing)
        findings.append(
            _finding(
                Check.COLUMN_MISSING,
                Severity.ERROR,
                pub,
                f"column(s) {idents(c.name for c in missing)} exist on the publisher but not on "
                f'the subscriber; replication stops at the first change ("logical replication '
                f'target relation ... is missing replicated column").',
                f"on the subscriber: ALTER TABLE {t} {adds}",
            )
        )
    generated = [c.name for c in sent if (s := sub.column(c.name)) is not None and s.generated]
    if generated:
        findings.append(
            _finding(
                Check.COLUMN_GENERATED_ON_SUBSCRIBER,
                Severity.ERROR,
                pub,
                f"column(s) {idents(generated)} are generated on the subscriber and cannot "
                f"receive the values the publisher sends.",
                f"on the subscriber, make {idents(generated)} ordinary columns "
                f"(ALTER TABLE {t} ALTER COLUMN <column> DROP EXPRESSION)",
            )
        )
    differ = [
        (c, s)
        for c in sent
        if (s := sub.column(c.name)) is not None and not s.generated and s.type != c.type
    ]
    if differ:
        listed = "; ".join(f"{ident(c.name)} is {c.type} there, {s.type} here" for c, s in differ)
        findings.append(
            _finding(
                Check.COLUMN_TYPE_DIFFERS,
                Severity.WARNING,
                pub,
                f"column types differ from the publisher's ({listed}); values travel as text, so "
                f"this works only while every value's text form is valid for the subscriber's "
                f"type (an overflow or format error stops replication).",
                "give the subscriber's columns the publisher's types, or confirm every value "
                "converts",
            )
        )
    return findings


def _extra_column_findings(pub: TableFacts, extra: list[Column]) -> list[Finding]:
    """A subscriber-only NOT NULL column needs a default: replicated rows never carry it."""
    t = pub.table
    stuck = [c for c in extra if c.not_null and not c.fills_itself]
    if not stuck:
        return []
    sets = "; ".join(
        f"ALTER TABLE {t} ALTER COLUMN {ident(c.name)} SET DEFAULT <value>" for c in stuck
    )
    return [
        _finding(
            Check.NOT_NULL_WITHOUT_DEFAULT,
            Severity.ERROR,
            pub,
            f"subscriber-only column(s) {idents(c.name for c in stuck)} are NOT NULL without "
            f"a default: the initial copy and the first replicated INSERT fail with a "
            f"not-null violation and replication stops.",
            f"on the subscriber: {sets} (or DROP NOT NULL, or add the column on the publisher too)",
        )
    ]


def _key_findings(
    pub: TableFacts,
    sub: TableFacts,
    identity: IdentityAssessment | None,
    extra: list[Column],
) -> list[Finding]:
    """Can the subscriber find the row an UPDATE or DELETE names?"""
    if identity is None or identity.blocks_changes or identity.cls is IdentityClass.PARTITIONED:
        return []  # nothing to match (already reported), or judged per partition
    if sub.relkind != "r":
        return []
    t = pub.table
    sent_key = set(identity.key_columns)
    sub_key = subscriber_key(sub)
    if sub_key is None:
        if identity.cls is not IdentityClass.FULL:
            return [
                _finding(
                    Check.SUBSCRIBER_KEY_MISMATCH,
                    Severity.ERROR,
                    pub,
                    "has neither a primary key nor a replica identity index on the subscriber, "
                    "and the publisher's identity is not FULL: every UPDATE and DELETE stops "
                    'replication ("logical replication target relation ... has neither REPLICA '
                    'IDENTITY index nor PRIMARY KEY").',
                    f"on the subscriber: ALTER TABLE {t} ADD PRIMARY KEY "
                    f"({idents(identity.key_columns)}) (the publisher's key)",
                )
            ]
        filled = [c.name for c in extra if c.fills_itself]
        if filled:
            return [
                _finding(
                    Check.FULL_IDENTITY_EXTRA_COLUMNS,
                    Severity.ERROR,
                    pub,
                    f"the publisher's identity is FULL and the subscriber's table has no key, so "
                    f"the subscriber finds a changed row by comparing every column; its "
                    f"subscriber-only column(s) {idents(filled)} get values (defaults) the "
                    f"publisher never sends, so UPDATE and DELETE silently find no row and the "
                    f"tables drift apart.",
                    f"on the subscriber, add a primary key or unique index over columns the "
                    f"publisher sends (ALTER TABLE {t} ADD PRIMARY KEY (<columns>)), or drop "
                    f"the defaults of {idents(filled)}",
                )
            ]
        return []
    unsent = [c for c in sub_key if c not in sent_key]
    if unsent:
        return [
            _finding(
                Check.SUBSCRIBER_KEY_MISMATCH,
                Severity.ERROR,
                pub,
                f"the subscriber finds rows by its key ({idents(sub_key)}), but column(s) "
                f"{idents(unsent)} are not in the key the publisher sends "
                f"({idents(identity.key_columns) or 'none'}): every UPDATE and DELETE stops "
                f'replication ("publisher did not send replica identity column expected by the '
                f'logical replication target relation").',
                f"give the subscriber's table the publisher's key ({idents(identity.key_columns)})"
                f" as primary key or REPLICA IDENTITY USING INDEX, or widen the publisher's "
                f"identity to cover {idents(unsent)}",
            )
        ]
    return []
