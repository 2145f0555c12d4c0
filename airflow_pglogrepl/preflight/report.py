"""The preflight report: every finding with its table, reason and fix, readable and as JSON.

``PreflightReport.summary()`` is the text a DBA reads when the task fails; ``to_dict()`` is what
the operator pushes to XCom. Both list every finding, not only the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airflow_pglogrepl.tables import TableRef


class Severity(StrEnum):
    """How bad a finding is."""

    ERROR = "error"
    """Blocks replication (or makes writes on the publisher fail): the preflight fails."""
    WARNING = "warning"
    """Replication works, but slowly or fragilely; fails only with ``fail_on_warnings``."""


class Side(StrEnum):
    """Which server a finding is about."""

    PUBLISHER = "publisher"
    SUBSCRIBER = "subscriber"


class Check(StrEnum):
    """Stable names of the checks; the ``check`` key of each finding."""

    # publisher server and role
    WAL_LEVEL = "wal_level"
    REPLICATION_SLOTS = "max_replication_slots"
    WAL_SENDERS = "max_wal_senders"
    TEMP_FILE_LIMIT = "temp_file_limit"
    IDLE_SLOT_TIMEOUT = "idle_replication_slot_timeout"
    REPLICATION_ROLE = "replication_role"
    # publisher tables
    NO_TABLES = "no_tables"
    PUBLICATION_MISSING = "publication_missing"
    TABLE_MISSING_ON_PUBLISHER = "table_missing_on_publisher"
    TABLE_KIND = "table_kind"
    TABLE_NOT_PERMANENT = "table_not_permanent"
    SCHEMA_USAGE = "schema_usage"
    SELECT_PRIVILEGE = "select_privilege"
    # replica identity
    IDENTITY_NO_KEY = "identity_no_key"
    IDENTITY_UNIQUE_INDEX_UNUSED = "identity_unique_index_unused"
    IDENTITY_NULLABLE_UNIQUE_INDEX = "identity_nullable_unique_index"
    IDENTITY_NOTHING = "identity_nothing"
    IDENTITY_INDEX_MISSING = "identity_index_missing"
    IDENTITY_FULL = "identity_full"
    IDENTITY_FIX_FAILED = "identity_fix_failed"
    # subscriber server
    LOGICAL_WORKERS = "max_logical_replication_workers"
    WORKER_PROCESSES = "max_worker_processes"
    REPLICATION_ORIGINS = "replication_origins"
    # subscriber tables
    TABLE_MISSING_ON_SUBSCRIBER = "table_missing_on_subscriber"
    SUBSCRIBER_TABLE_KIND = "subscriber_table_kind"
    COLUMN_MISSING = "column_missing"
    COLUMN_GENERATED_ON_SUBSCRIBER = "column_generated_on_subscriber"
    NOT_NULL_WITHOUT_DEFAULT = "not_null_without_default"
    COLUMN_TYPE_DIFFERS = "column_type_differs"
    SUBSCRIBER_KEY_MISMATCH = "subscriber_key_mismatch"
    FULL_IDENTITY_EXTRA_COLUMNS = "full_identity_extra_columns"


@dataclass(frozen=True)
class Finding:
    """One thing wrong: which check, where, why, and what to do about it."""

    check: Check
    severity: Severity
    side: Side
    message: str
    fix: str
    table: TableRef | None = None

    def line(self) -> str:
        """``[publisher] public.orders: <message> Fix: <fix>`` (one finding, one paragraph)."""
        where = f" {self.table}:" if self.table is not None else ""
        return f"[{self.side.value}]{where} {self.message} Fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``check``, ``severity``, ``side``, ``table`` (text or null), ``message``,
        ``fix``."""
        return {
            "check": self.check.value,
            "severity": self.severity.value,
            "side": self.side.value,
            "table": None if self.table is None else str(self.table),
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class AppliedFix:
    """A replica identity change the operator made, and what the table looked like before/after."""

    table: TableRef
    statement: str
    before: str
    after: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``table``, ``statement``, ``before`` and ``after`` identity classes."""
        return {
            "table": str(self.table),
            "statement": self.statement,
            "before": self.before,
            "after": self.after,
        }


@dataclass
class TableDetail:
    """What preflight learnt about one table (listed ones and the partitions behind them)."""

    table: TableRef
    kind: str | None = None  # None when the publisher does not have it
    persistence: str | None = None
    replica_identity: str | None = None  # default / nothing / full / index
    identity_class: str | None = None  # see identity.IdentityClass
    identity_columns: tuple[str, ...] = ()
    partition_of: TableRef | None = None
    on_subscriber: bool | None = None  # None: not checked (partitions are not)

    def to_dict(self, findings: list[Finding]) -> dict[str, Any]:
        """JSON form, with the check names of this table's problems and warnings."""
        mine = [f for f in findings if f.table == self.table]
        return {
            "kind": self.kind,
            "persistence": self.persistence,
            "replica_identity": self.replica_identity,
            "identity_class": self.identity_class,
            "identity_columns": list(self.identity_columns),
            "partition_of": None if self.partition_of is None else str(self.partition_of),
            "on_subscriber": self.on_subscriber,
            "problems": [f.check.value for f in mine if f.severity is Severity.ERROR],
            "warnings": [f.check.value for f in mine if f.severity is Severity.WARNING],
        }


@dataclass
class PreflightReport:
    """The outcome of a preflight: findings, per-table details, capacity numbers, fixes made."""

    publication: str | None
    tables: list[TableRef]
    planned_subscriptions: int
    findings: list[Finding] = field(default_factory=list)
    details: dict[TableRef, TableDetail] = field(default_factory=dict)
    capacity: dict[str, dict[str, Any]] = field(default_factory=dict)
    fixes_applied: list[AppliedFix] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        """Findings that block replication."""
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        """Findings that do not block replication."""
        return [f for f in self.findings if f.severity is Severity.WARNING]

    @property
    def ok(self) -> bool:
        """True when nothing blocks replication (warnings allowed)."""
        return not self.problems

    def checks(self, table: TableRef | str | None = None) -> set[str]:
        """Names of the checks that found something (for one table when given)."""
        ref = None if table is None else TableRef.parse(table)
        return {f.check.value for f in self.findings if ref is None or f.table == ref}

    def summary(self) -> str:
        """Readable text listing every problem and warning with its fix."""
        subject = f"publication {self.publication!r}" if self.publication else "the listed tables"
        count = len(self.tables)
        head = (
            f"Replication preflight for {subject} ({count} table{'s' if count != 1 else ''}, "
            f"{self.planned_subscriptions} planned subscription"
            f"{'s' if self.planned_subscriptions != 1 else ''}): "
        )
        problems, warnings = self.problems, self.warnings
        if self.ok:
            head += "nothing blocks replication"
        else:
            head += f"{len(problems)} problem{'s' if len(problems) != 1 else ''} block replication"
        if warnings:
            head += f", {len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
        lines = [head + "."]
        for title, items in (("Problems", problems), ("Warnings", warnings)):
            if items:
                lines.append(f"{title}:")
                lines += [f"  {n}. {f.line()}" for n, f in enumerate(items, 1)]
        if self.fixes_applied:
            lines.append("Replica identity changed:")
            lines += [
                f"  - {fix.table}: {fix.before} -> {fix.after} ({fix.statement})"
                for fix in self.fixes_applied
            ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the XCom value).

        Keys: ``ok``, ``publication``, ``planned_subscriptions``, ``tables`` (table text ->
        detail), ``problems`` and ``warnings`` (lists of findings), ``capacity`` (``publisher``
        and ``subscriber`` numbers), ``fixes_applied``, ``summary``.
        """
        return {
            "ok": self.ok,
            "publication": self.publication,
            "planned_subscriptions": self.planned_subscriptions,
            "tables": {
                str(ref): detail.to_dict(self.findings) for ref, detail in self.details.items()
            },
            "problems": [f.to_dict() for f in self.problems],
            "warnings": [f.to_dict() for f in self.warnings],
            "capacity": self.capacity,
            "fixes_applied": [fix.to_dict() for fix in self.fixes_applied],
            "summary": self.summary(),
        }
