"""Replica identity: classify a published table's setup and plan the ``ALTER TABLE`` that fixes it.

UPDATE and DELETE reach the subscriber only with an old-row key, the table's replica identity
(``pg_class.relreplident``). Three setups work: a primary key with identity DEFAULT; no primary
key but a unique index on NOT NULL columns named with ``USING INDEX``; or FULL, which works but
makes the subscriber search for every changed row. Anything else makes UPDATE and DELETE fail on
the publisher as soon as the table is in a publication that publishes them.
See https://www.postgresql.org/docs/15/logical-replication-publication.html and
https://www.postgresql.org/docs/15/sql-altertable.html#SQL-ALTERTABLE-REPLICA-IDENTITY
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from airflow_pglogrepl.models.facts import IndexFacts, TableFacts
from airflow_pglogrepl.preflight._text import ident, idents
from airflow_pglogrepl.preflight.report import Check, Severity
from airflow_pglogrepl.tables import TableRef


class IdentityClass(StrEnum):
    """How a table's rows are identified for UPDATE and DELETE (the ``identity_class`` key)."""

    PRIMARY_KEY = "primary_key"
    """Identity DEFAULT and a primary key: the recommended setup."""
    INDEX = "index"
    """Identity USING INDEX on a unique index over NOT NULL columns: fine."""
    FULL = "full"
    """Identity FULL: works, but the whole old row is logged and the subscriber searches for it."""
    UNIQUE_INDEX_UNUSED = "unique_index_unused"
    """DEFAULT without a primary key, but a usable unique index exists: needs USING INDEX."""
    NULLABLE_UNIQUE_INDEX = "nullable_unique_index"
    """No usable key; a unique index exists but covers nullable columns."""
    NO_KEY = "no_key"
    """DEFAULT, no primary key, no usable unique index: there is no identity."""
    NOTHING = "nothing"
    """Identity NOTHING: UPDATE and DELETE are refused on the publisher."""
    INDEX_MISSING = "index_missing"
    """Identity USING INDEX whose index was dropped: acts as NOTHING."""
    PARTITIONED = "partitioned"
    """A partitioned table: each leaf partition's identity counts, judged separately."""


class FixMode(StrEnum):
    """What ``fix_replica_identity`` may change."""

    NONE = "none"
    """Change nothing; report only."""
    INDEX = "index"
    """Use a key where one exists: DEFAULT for a primary key, else USING the best usable index."""
    FULL = "full"
    """As ``index``, and FULL for tables with no usable key at all (slow fallback)."""


WORKING = frozenset({IdentityClass.PRIMARY_KEY, IdentityClass.INDEX, IdentityClass.PARTITIONED})


@dataclass(frozen=True)
class IdentityFix:
    """One ``ALTER TABLE ... REPLICA IDENTITY`` to run: ``mode`` is default, index or full."""

    table: TableRef
    mode: str
    index: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("default", "index", "full"):
            raise ValueError(f"unknown replica identity fix mode {self.mode!r}")
        if (self.mode == "index") != (self.index is not None):
            raise ValueError("an index name is needed with mode 'index', and only then")

    @property
    def statement(self) -> str:
        """The statement as text, for messages and the report (the hook composes its own)."""
        target = f"USING INDEX {ident(self.index)}" if self.index else self.mode.upper()
        return f"ALTER TABLE {self.table} REPLICA IDENTITY {target}"


@dataclass(frozen=True)
class IdentityAssessment:
    """The verdict on one table: class, the key columns the publisher sends, and the remedy.

    ``key_columns`` are what UPDATE/DELETE messages carry to find the old row (all columns for
    FULL; empty when there is no identity). ``finding`` is ``(check, severity, message, fix)``
    or None when the setup is fine.
    """

    table: TableRef
    cls: IdentityClass
    key_columns: tuple[str, ...]
    best_index: IndexFacts | None
    finding: tuple[Check, Severity, str, str] | None

    @property
    def blocks_changes(self) -> bool:
        """True when UPDATE and DELETE of this table cannot be replicated."""
        return self.cls not in WORKING and self.cls is not IdentityClass.FULL


def best_unique_index(table: TableFacts) -> IndexFacts | None:
    """The usable non-primary unique index with the fewest columns (then by name)."""
    usable = [i for i in table.indexes if i.usable and not i.primary]
    return min(usable, key=lambda i: (len(i.columns), i.name), default=None)


def _nullable_candidate(table: TableFacts) -> IndexFacts | None:
    """A unique index that only nullability keeps from serving (fewest nullable columns)."""
    only_nullable = [
        i
        for i in table.indexes
        if i.nullable_columns
        and i.unique
        and not (i.partial or i.expression or not i.immediate or not i.valid)
    ]
    return min(
        only_nullable, key=lambda i: (len(i.nullable_columns), len(i.columns), i.name), default=None
    )


def _no_key_fix(t: TableRef, nullable: IndexFacts | None) -> str:
    parts = []
    if nullable is not None:
        cols = nullable.nullable_columns
        set_nn = "; ".join(f"ALTER TABLE {t} ALTER COLUMN {ident(c)} SET NOT NULL" for c in cols)
        parts.append(
            f"make the index usable: {set_nn} (fails if NULLs are present), then ALTER TABLE {t} "
            f"REPLICA IDENTITY USING INDEX {ident(nullable.name)}"
        )
    parts.append(f"add a primary key (ALTER TABLE {t} ADD PRIMARY KEY (<columns>))")
    parts.append(
        f"as a slow fallback, ALTER TABLE {t} REPLICA IDENTITY FULL "
        f"(fix_replica_identity='full' applies it)"
    )
    return "; or ".join(parts)


def _key_fix(t: TableRef, table: TableFacts, best: IndexFacts | None) -> str | None:
    """The fix when a key exists; None when the table has no usable key."""
    if table.primary_key is not None:
        return (
            f"ALTER TABLE {t} REPLICA IDENTITY DEFAULT (uses its primary key "
            f"{ident(table.primary_key.name)}; fix_replica_identity='index' applies it)"
        )
    if best is not None:
        return (
            f"ALTER TABLE {t} REPLICA IDENTITY USING INDEX {ident(best.name)} (unique on NOT NULL "
            f"{idents(best.columns)}; fix_replica_identity='index' applies it)"
        )
    return None


# An assessment's finding: (check, severity, message, fix).
_IdentityFinding = tuple[Check, Severity, str, str]

_FAILS = (
    "so every UPDATE and DELETE on it fails on the publisher once it is in a publication that "
    'publishes them ("cannot update table ... because it does not have a replica identity")'
)


def assess(table: TableFacts) -> IdentityAssessment:
    """Classify ``table``'s replica identity setup (plain tables and leaf partitions)."""
    t = table.table
    best = best_unique_index(table)
    pk = table.primary_key
    ri = table.replica_identity

    def verdict(
        cls: IdentityClass,
        keys: tuple[str, ...] = (),
        finding: _IdentityFinding | None = None,
    ) -> IdentityAssessment:
        return IdentityAssessment(t, cls, keys, best, finding)

    if table.relkind == "p":
        return verdict(IdentityClass.PARTITIONED)
    if ri == "d" and pk is not None:
        return verdict(IdentityClass.PRIMARY_KEY, pk.columns)
    identity_index = table.identity_index
    if ri == "i" and identity_index is not None:
        return verdict(IdentityClass.INDEX, identity_index.columns)
    if ri == "f":
        return verdict(
            IdentityClass.FULL, tuple(c.name for c in table.columns), _full_finding(table, best)
        )
    cls, finding = _no_identity(table, best)
    return verdict(cls, finding=finding)


def _full_finding(table: TableFacts, best: IndexFacts | None) -> _IdentityFinding:
    """REPLICA IDENTITY FULL works, but logs whole old rows and makes the subscriber search."""
    t = table.table
    key_fix = _key_fix(t, table, best)
    return (
        Check.IDENTITY_FULL,
        Severity.WARNING,
        "has REPLICA IDENTITY FULL: every UPDATE and DELETE logs the whole old row, and "
        "unless the subscriber's table has a primary key or identity index the subscriber "
        "scans the whole table to find each changed row.",
        key_fix
        or f"add a primary key or a unique index on NOT NULL columns, then use it as the "
        f"replica identity (ALTER TABLE {t} REPLICA IDENTITY DEFAULT / USING INDEX ...); "
        f"keep FULL only for small tables",
    )


def _no_identity(
    table: TableFacts, best: IndexFacts | None
) -> tuple[IdentityClass, _IdentityFinding]:
    """The class and finding of a table with no identity: NOTHING, a dropped identity index,
    or DEFAULT without a primary key."""
    t = table.table
    nullable = _nullable_candidate(table)
    key_fix = _key_fix(t, table, best)
    if table.replica_identity == "n":
        return IdentityClass.NOTHING, (
            Check.IDENTITY_NOTHING,
            Severity.ERROR,
            f"has REPLICA IDENTITY NOTHING, {_FAILS}; only INSERT and TRUNCATE replicate.",
            key_fix or _no_key_fix(t, nullable),
        )
    if table.replica_identity == "i":
        return IdentityClass.INDEX_MISSING, (
            Check.IDENTITY_INDEX_MISSING,
            Severity.ERROR,
            "has REPLICA IDENTITY USING INDEX, but that index no longer exists (dropped or "
            f"replaced without re-pointing the identity); it acts as NOTHING, {_FAILS}.",
            key_fix or _no_key_fix(t, nullable),
        )
    return _default_without_key(table, best, nullable, key_fix)


def _default_without_key(
    table: TableFacts, best: IndexFacts | None, nullable: IndexFacts | None, key_fix: str | None
) -> tuple[IdentityClass, _IdentityFinding]:
    """DEFAULT without a primary key: no identity at all; say which index could serve."""
    t = table.table
    if best is not None:
        return IdentityClass.UNIQUE_INDEX_UNUSED, (
            Check.IDENTITY_UNIQUE_INDEX_UNUSED,
            Severity.ERROR,
            f"has no primary key and REPLICA IDENTITY DEFAULT, which then means no identity, "
            f"{_FAILS}. Its unique index {ident(best.name)} on NOT NULL column(s) "
            f"{idents(best.columns)} can serve as the identity.",
            key_fix or "",
        )
    if nullable is not None:
        return IdentityClass.NULLABLE_UNIQUE_INDEX, (
            Check.IDENTITY_NULLABLE_UNIQUE_INDEX,
            Severity.ERROR,
            f"has no primary key, and its unique index {ident(nullable.name)} cannot be used "
            f"as replica identity because {nullable.unusable_reason} (a unique index allows "
            f"several NULLs, so it does not identify a row); with REPLICA IDENTITY DEFAULT "
            f"there is no identity, {_FAILS}.",
            _no_key_fix(t, nullable),
        )
    unusable = [i for i in table.indexes if not i.usable]
    why = "".join(
        f" Unique index {ident(i.name)} cannot serve: {i.unusable_reason}." for i in unusable
    )
    return IdentityClass.NO_KEY, (
        Check.IDENTITY_NO_KEY,
        Severity.ERROR,
        f"has no primary key and no unique index on NOT NULL columns, and REPLICA IDENTITY "
        f"DEFAULT, {_FAILS}.{why}",
        _no_key_fix(t, None),
    )


def plan_fix(table: TableFacts, mode: FixMode) -> IdentityFix | None:
    """The identity change ``mode`` allows for ``table``, or None (fine already, or not allowed).

    ``index`` (and ``full``) switch to a key when one exists: DEFAULT when there is a primary key,
    else USING the best usable unique index; this also replaces FULL. ``full`` additionally sets
    FULL on tables with no usable key. Partitioned parents are never altered (the identity of a
    partitioned table does not reach its partitions; their own identities are fixed instead).
    """
    if mode is FixMode.NONE or table.relkind != "r":
        return None
    verdict = assess(table)
    if verdict.cls in WORKING:
        return None
    if table.primary_key is not None:
        return IdentityFix(table.table, "default")
    if verdict.best_index is not None:
        return IdentityFix(table.table, "index", verdict.best_index.name)
    if mode is FixMode.FULL and verdict.cls is not IdentityClass.FULL:
        return IdentityFix(table.table, "full")
    return None
