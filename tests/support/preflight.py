"""Builders of hand-made catalog facts for the preflight rules."""

from __future__ import annotations

from typing import Any

from airflow_pglogrepl.models.facts import (
    IndexFacts,
    Inspection,
    PublisherUsage,
    RoleFacts,
    SideFacts,
    SubscriberUsage,
    TableFacts,
)
from airflow_pglogrepl.models.records import ServerFacts
from airflow_pglogrepl.preflight.report import PreflightReport
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
