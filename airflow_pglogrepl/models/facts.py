"""What the catalog inspection reads from the two servers, as plain records.

The hook (``hooks/catalog.py``) fills these in; the rules (``identity``, ``sizing``, ``schema``)
judge them. Nothing here talks to a server, so every rule is tested with hand-built facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_pglogrepl.models.records import ServerFacts
from airflow_pglogrepl.tables import Column, TableRef

# pg_class.relkind and relpersistence codes, in the words a DBA uses.
# See https://www.postgresql.org/docs/15/catalog-pg-class.html
RELKIND_NAMES = {
    "r": "table",
    "p": "partitioned table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
    "S": "sequence",
    "c": "composite type",
    "i": "index",
    "I": "partitioned index",
    "t": "TOAST table",
}
PUBLISHABLE_RELKINDS = frozenset("rp")
PERSISTENCE_NAMES = {"p": "permanent", "u": "unlogged", "t": "temporary"}
# pg_class.relreplident
IDENTITY_NAMES = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


@dataclass(frozen=True)
class RoleFacts:
    """The role a connection logged in as (``current_user``) and its replication-related flags."""

    name: str
    superuser: bool
    replication: bool
    can_login: bool = True
    bypass_rls: bool = False


@dataclass(frozen=True)
class IndexFacts:
    """A unique index of a table: what decides whether it can be the replica identity.

    ``columns`` are the key columns in index order (``INCLUDE`` columns left out);
    ``nullable_columns`` those of them without ``NOT NULL``.
    """

    name: str
    columns: tuple[str, ...]
    nullable_columns: tuple[str, ...] = ()
    primary: bool = False
    unique: bool = True
    replica_identity: bool = False  # pg_index.indisreplident
    valid: bool = True
    immediate: bool = True  # not DEFERRABLE
    partial: bool = False
    expression: bool = False

    @property
    def unusable_reason(self) -> str | None:
        """Why PostgreSQL would refuse ``REPLICA IDENTITY USING INDEX`` on it; None when usable.

        The same conditions as ``ALTER TABLE ... REPLICA IDENTITY USING INDEX`` checks.
        See https://www.postgresql.org/docs/15/sql-altertable.html#SQL-ALTERTABLE-REPLICA-IDENTITY
        """
        if not self.unique:
            return "it is not unique"
        if self.partial:
            return "it is a partial index (it has a WHERE clause)"
        if self.expression:
            return "it indexes an expression"
        if not self.immediate:
            return "it is deferrable"
        if not self.valid:
            return "it is invalid (a failed CREATE INDEX CONCURRENTLY); REINDEX or drop it"
        if self.nullable_columns:
            names = ", ".join(f'"{c}"' for c in self.nullable_columns)
            plural = "s" if len(self.nullable_columns) > 1 else ""
            verb = "are" if plural else "is"
            return f"column{plural} {names} {verb} nullable"
        return None

    @property
    def usable(self) -> bool:
        """True when it can serve as the replica identity."""
        return self.unusable_reason is None


@dataclass(frozen=True)
class TableFacts:
    """A relation found by schema-qualified name, with what preflight judges about it.

    ``can_select`` / ``can_use_schema`` are the connecting role's privileges.
    ``leaf_partitions`` lists, for a partitioned table, its leaf partitions (all levels).
    """

    table: TableRef
    relkind: str
    persistence: str = "p"
    replica_identity: str = "d"
    columns: tuple[Column, ...] = ()
    indexes: tuple[IndexFacts, ...] = ()
    can_select: bool = True
    can_use_schema: bool = True
    leaf_partitions: tuple[TableRef, ...] = ()

    @property
    def kind(self) -> str:
        """``table``, ``partitioned table``, ``view`` ..."""
        return RELKIND_NAMES.get(self.relkind, f"relation of kind {self.relkind!r}")

    @property
    def primary_key(self) -> IndexFacts | None:
        """The primary key's index, if any."""
        return next((i for i in self.indexes if i.primary), None)

    @property
    def identity_index(self) -> IndexFacts | None:
        """The index marked as replica identity (``indisreplident``), if any."""
        return next((i for i in self.indexes if i.replica_identity), None)

    def column(self, name: str) -> Column | None:
        """The column called ``name`` (exact, as stored), or None."""
        return next((c for c in self.columns if c.name == name), None)


@dataclass(frozen=True)
class PublisherUsage:
    """Replication capacity already taken on the publisher.

    ``slots_in_use`` counts every row of ``pg_replication_slots`` (logical and physical; a slot
    takes capacity whether or not it is active). ``wal_senders_in_use`` counts
    ``pg_stat_replication`` rows (physical standbys, subscriptions, ``pg_recvlogical`` ...).
    """

    slots_in_use: int
    wal_senders_in_use: int


@dataclass(frozen=True)
class SubscriberUsage:
    """Logical replication workers already taken on the subscriber (the whole cluster).

    Each enabled subscription keeps one apply worker; ``extra_workers_running`` counts the
    table-sync (and, from PostgreSQL 16, parallel apply) workers running right now.
    ``subscriptions`` counts all subscriptions, enabled or not: each keeps a replication origin.
    """

    subscriptions: int
    enabled_subscriptions: int
    extra_workers_running: int

    @property
    def logical_workers_in_use(self) -> int:
        """Workers the existing subscriptions hold (or will start) on the subscriber."""
        return self.enabled_subscriptions + self.extra_workers_running

    @property
    def origins_in_use(self) -> int:
        """Replication origins the existing subscriptions hold (each sync worker holds one too)."""
        return self.subscriptions + self.extra_workers_running


@dataclass(frozen=True)
class SideFacts:
    """Everything read from one server."""

    server: ServerFacts
    tables: dict[TableRef, TableFacts] = field(default_factory=dict)
    role: RoleFacts | None = None
    publisher_usage: PublisherUsage | None = None
    subscriber_usage: SubscriberUsage | None = None


@dataclass(frozen=True)
class Inspection:
    """The inputs of one preflight run: the table set and what both servers said about it.

    ``publisher.tables`` also holds the leaf partitions of partitioned tables (their replica
    identity is what UPDATE and DELETE check), which need not be in ``tables``.
    """

    tables: tuple[TableRef, ...]
    publisher: SideFacts
    subscriber: SideFacts
    publication: str | None = None
    publication_exists: bool = True
    planned_subscriptions: int = 1
