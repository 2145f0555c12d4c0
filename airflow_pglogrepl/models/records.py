"""Typed records the hook returns: a replication slot, a created slot, the server's settings.

Every record of the hooks is a frozen dataclass on ``Record``, whose ``to_dict()`` gives plain
JSON types (LSNs and tables as PostgreSQL text, timestamps ISO 8601, nested records as dicts),
which is what operators push to XCom, so the XCom value reads the same as ``psql`` output.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef


def jsonable(value: Any) -> Any:
    """``value`` in plain JSON types, as ``Record.to_dict`` gives its fields."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, LSN | TableRef):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


class Record:
    """Base of the hooks' records (frozen dataclasses): one ``to_dict`` for all of them.

    ``dict_names`` renames fields in the dict where the XCom key predates the field's name.
    """

    dict_names: ClassVar[Mapping[str, str]] = {}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable form (LSNs and tables as text, timestamps ISO 8601)."""
        return {
            self.dict_names.get(f.name, f.name): jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }


@dataclass(frozen=True)
class SlotInfo(Record):
    """One row of ``pg_replication_slots``, plus how much WAL the slot holds back.

    ``restart_lsn`` is the oldest WAL the slot still needs (decoding restarts there);
    ``confirmed_flush_lsn`` is what the consumer has confirmed (changes come from there on).
    ``retained_bytes`` is the distance from ``restart_lsn`` to the server's current WAL position:
    the disk this slot keeps from being recycled.
    See https://www.postgresql.org/docs/15/view-pg-replication-slots.html
    """

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: LSN | None
    confirmed_flush_lsn: LSN | None
    wal_status: str | None
    safe_wal_size: int | None
    two_phase: bool | None
    retained_bytes: int | None
    current_lsn: LSN
    inactive_since: dt.datetime | None = None  # PostgreSQL 17+
    invalidation_reason: str | None = None  # 17+: why wal_status is lost
    failover: bool | None = None  # 17+: synchronized to standbys (sync_replication_slots)
    synced: bool | None = None  # 17+: a standby's copy of a primary's failover slot

    @property
    def is_logical(self) -> bool:
        """True for a logical (decoding) slot, False for a physical one."""
        return self.slot_type == "logical"


@dataclass(frozen=True)
class SlotCreated(Record):
    """What creating a logical slot returned: its name and its consistent point.

    Changes committed after ``lsn`` are decoded from this slot; nothing before it is.
    ``snapshot_name`` is set only when the slot was created with an exported snapshot.
    """

    name: str
    lsn: LSN
    plugin: str
    snapshot_name: str | None = None
    failover: bool = False  # 17+: synchronized to standbys (models.failover)


@dataclass(frozen=True)
class ServerFacts(Record):
    """Version and the settings logical replication depends on, sizes in bytes.

    ``max_slot_wal_keep_size`` is ``None`` when unlimited (``-1``): slots may then retain WAL
    until the disk is full.
    """

    version_num: int
    version: str
    in_recovery: bool
    wal_level: str
    max_replication_slots: int
    max_wal_senders: int
    max_logical_replication_workers: int
    max_worker_processes: int
    max_sync_workers_per_subscription: int
    logical_decoding_work_mem: int
    max_slot_wal_keep_size: int | None
    # bytes a session's temporary files may hold (None: unlimited); a peek holds its whole
    # result, at least the biggest transaction of a window, in one
    temp_file_limit: int | None = None
    # a lower bound of the biggest transaction any slot here decoded (pg_stat_replication_slots:
    # spilled or streamed bytes per transaction); None when none was that big
    largest_decoded_transaction: int | None = None
    # 18+: caps the subscriber's replication origins (None before 18: max_replication_slots)
    max_active_replication_origins: int | None = None
    # 18+: seconds a slot may stay inactive before a checkpoint invalidates it (None: off or
    # before 18)
    idle_replication_slot_timeout_s: int | None = None

    @property
    def major_version(self) -> int:
        """15 for 15.x, and so on."""
        return self.version_num // 10000


@dataclass(frozen=True)
class SlotSpill(Record):
    """A slot's decoding statistics (``pg_stat_replication_slots``, cumulative since reset).

    Transactions larger than ``logical_decoding_work_mem`` are spilled to disk (or streamed):
    ``spill_bytes / spill_txns`` is the average size of those, so the largest is at least that.
    """

    slot: str
    spill_txns: int
    spill_bytes: int
    stream_txns: int
    stream_bytes: int
    total_txns: int
    total_bytes: int

    @property
    def largest_at_least(self) -> int:
        """A lower bound of the biggest transaction decoded (0 when none was spilled)."""
        averages = [b // t for b, t in ((self.spill_bytes, self.spill_txns),
                                          (self.stream_bytes, self.stream_txns)) if t]  # fmt: skip
        return max(averages, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "largest_transaction_at_least": self.largest_at_least}


@dataclass(frozen=True)
class PublishedTable(Record):
    """One table in a publication, with its optional column list and row filter (PG 15+)."""

    table: TableRef
    columns: tuple[str, ...] | None = None
    row_filter: str | None = None


@dataclass(frozen=True)
class PublicationInfo(Record):
    """A publication as the server normalises it (row filters as ``pg_get_expr`` prints them)."""

    name: str
    all_tables: bool
    publish: tuple[str, ...]
    via_root: bool
    tables: tuple[PublishedTable, ...]
    schemas: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reconciled(Record):
    """What making an object match its definition did: ``created``, ``changed`` or ``unchanged``."""

    kind: str
    name: str
    action: str
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class SubscriptionInfo(Record):
    """A subscription's definition; the publisher's address only, never its password."""

    name: str
    enabled: bool
    slot_name: str | None
    publications: tuple[str, ...]
    binary: bool
    streaming: str
    synchronous_commit: str
    # host, port, dbname, user of the publisher (from subconninfo); None when this role may not
    # read subconninfo (superusers only; a non-superuser owns subscriptions on PostgreSQL 16+)
    target: dict[str, str] | None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


# pg_subscription_rel.srsubstate: https://www.postgresql.org/docs/15/catalog-pg-subscription-rel.html
REL_STATES = {
    "i": "initialize",
    "d": "copying data",
    "f": "finished copy",
    "s": "synchronized",
    "r": "ready",
}


@dataclass(frozen=True)
class RelState(Record):
    """One table of a subscription in ``pg_subscription_rel`` and its sync state."""

    table: TableRef
    state: str
    lsn: LSN | None


@dataclass(frozen=True)
class SubscriptionStatus(Record):
    """What the subscriber says about a subscription's progress and health right now.

    ``apply_error_count``/``sync_error_count`` come from ``pg_stat_subscription_stats``
    (PostgreSQL 15+; ``None`` before). ``workers`` counts running apply and table-sync workers.
    """

    name: str
    exists: bool
    enabled: bool = False
    relations: tuple[RelState, ...] = ()
    workers: int = 0
    apply_worker: bool = False
    received_lsn: LSN | None = None
    latest_end_lsn: LSN | None = None
    apply_error_count: int | None = None
    sync_error_count: int | None = None

    @property
    def state_counts(self) -> dict[str, int]:
        """How many tables are in each state (``{"r": 3, "d": 1}``)."""
        counts: dict[str, int] = {}
        for rel in self.relations:
            counts[rel.state] = counts.get(rel.state, 0) + 1
        return counts

    @property
    def not_ready(self) -> tuple[RelState, ...]:
        """Tables not yet in state ``r``."""
        return tuple(rel for rel in self.relations if rel.state != "r")

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "state_counts": self.state_counts}


@dataclass(frozen=True)
class ColumnOrigin(Record):
    """What the publisher's catalog says about a column the lake sees for the first time.

    PostgreSQL adds a column with a constant ``DEFAULT`` without rewriting the table: the rows
    that existed keep no value on disk, and read the column's *missing value*
    (``pg_attribute.attmissingval``) instead. No change is decoded for them, so this is the only
    place the lake can learn what they hold. ``missing`` is that value as PostgreSQL prints it
    (None: the rows read NULL, or the table was rewritten since and holds the values on disk,
    which ``has_default`` then hints at).
    """

    name: str
    exists: bool
    missing: str | None = None
    has_default: bool = False
    attnum: int | None = None  # its position among the table's attributes, dropped ones counted


@dataclass(frozen=True)
class ColumnOrigins(Record):
    """``ColumnOrigin`` of some columns, and how many attribute numbers the table has used
    (``relnatts``, dropped columns counted).

    PostgreSQL never reuses an attribute number, while a renamed column keeps its own: that
    tells a ``RENAME COLUMN`` (which pgoutput shows as one name gone and another new) from a
    ``DROP`` and an ``ADD``.
    """

    natts: int
    columns: dict[str, ColumnOrigin]


@dataclass(frozen=True)
class TableChecksum(Record):
    """Row count and order-independent checksum of a table (``postgres.parity.table_checksum``)."""

    rows: int
    checksum: int


@dataclass(frozen=True)
class OwnedSequence(Record):
    """A sequence behind an identity or serial column (``kind``: ``identity`` or ``serial``)."""

    sequence: TableRef
    table: TableRef
    column: str
    kind: str


@dataclass(frozen=True)
class SequenceState(Record):
    """One row of ``pg_sequences``; ``last_value`` is ``None`` until ``nextval`` first ran."""

    sequence: TableRef
    last_value: int | None
    increment: int
    min_value: int
    max_value: int
    # ``last_value`` reads NULL both for a sequence never used and for one the role may not
    # read (it needs SELECT or USAGE): this tells them apart
    readable: bool = True


@dataclass(frozen=True)
class SubscriptionErrors(Record):
    """What the subscriber can tell, over SQL, about a subscription's apply and sync errors.

    The error text itself (and the failing transaction's finish LSN, in the line
    ``... in transaction <xid>, finished at <LSN>``) is only in the subscriber's server log.
    ``origin_lsn`` is the end of the last remote transaction applied (its replication origin);
    ``skip_lsn`` a pending ``ALTER SUBSCRIPTION ... SKIP`` (PostgreSQL 15+).
    """

    name: str
    exists: bool
    enabled: bool = False
    slot_name: str | None = None
    publications: tuple[str, ...] = ()
    apply_worker_pid: int | None = None
    sync_workers: tuple[TableRef, ...] = ()
    apply_error_count: int | None = None
    sync_error_count: int | None = None
    stats_reset: dt.datetime | None = None
    skip_lsn: LSN | None = None
    origin_lsn: LSN | None = None
    not_ready: tuple[RelState, ...] = ()
    # 18+: pg_stat_subscription_stats' conflict counters by kind (insert_exists, ...); None
    # before 18, where the server does not count them
    conflicts: dict[str, int] | None = None

    dict_names = {"name": "subscription"}
