"""Every record of the hooks is built on ``Record``: one ``to_dict`` gives the XCom form (LSNs
and tables as text, timestamps ISO 8601, nested records as dicts), with the keys XCom readers
already know."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import inspect
import json
import pkgutil

import airflow_pglogrepl.hooks
import airflow_pglogrepl.postgres
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.fence import FenceApplied, FenceGrant, FenceReleased, RoleFence
from airflow_pglogrepl.models.records import (
    PublicationInfo,
    PublishedTable,
    Record,
    RelState,
    SlotSpill,
    SubscriptionErrors,
    SubscriptionStatus,
)
from airflow_pglogrepl.tables import TableRef

T0 = dt.datetime(2026, 11, 25, 3, 0, tzinfo=dt.UTC)
ORDERS = TableRef("sales", "Orders;")


def test_every_dataclass_the_hooks_return_is_a_record() -> None:
    """What the hooks' modules and the statements under them (``postgres``) define, and the
    records they return from ``models`` (the catalog facts and verdicts are the pure rules'
    inputs, no XCom values)."""
    packages = (airflow_pglogrepl.hooks, airflow_pglogrepl.postgres)
    names = [
        info.name
        for package in packages
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    ]
    not_records = [
        f"{module.__name__}.{name}"
        for module_name in [*names, "airflow_pglogrepl.models.records",
                            "airflow_pglogrepl.models.fence"]
        for module in [importlib.import_module(module_name)]
        for name, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls)
        and not issubclass(cls, Record)
    ]  # fmt: skip
    # the snapshot's catalog description travels to executors, the replication stream's
    # frames and its walsender's state stay inside the source stage, and the publications'
    # coverage is the drain's to compare with its lake: no XCom records
    assert sorted(not_records) == [
        "airflow_pglogrepl.postgres.backfill.BackfillStart",
        "airflow_pglogrepl.postgres.backfill.ChunkSnapshot",
        "airflow_pglogrepl.postgres.backfill.HeapCheck",
        "airflow_pglogrepl.postgres.coverage.Leaf",
        "airflow_pglogrepl.postgres.coverage.PublishedRelation",
        "airflow_pglogrepl.postgres.coverage.SourceCoverage",
        "airflow_pglogrepl.postgres.coverage._Node",
        "airflow_pglogrepl.postgres.secret_statements.Quiet",
        "airflow_pglogrepl.postgres.snapshot.ExportedSnapshot",
        "airflow_pglogrepl.postgres.snapshot.SnapshotTable",
        "airflow_pglogrepl.postgres.stream_frames.FrameBatch",
        "airflow_pglogrepl.postgres.stream_frames.Keepalive",
        "airflow_pglogrepl.postgres.walsender.Look",
    ]


def test_the_fence_records_keep_their_xcom_keys_and_nest() -> None:
    grant = FenceGrant(ORDERS, "INSERT", grantable=True)
    applied = FenceApplied(
        fenced_at=T0,
        tables=(ORDERS,),
        states=(RoleFence("app", True, None, (grant,)),),
        changes=("REVOKE INSERT",),
    )
    assert applied.to_dict() == {
        "fenced_at": "2026-11-25T03:00:00+00:00",
        "tables": ['sales."Orders;"'],
        "saved": [
            {
                "role": "app",
                "read_only_set": True,
                "previous_read_only": None,
                "grants": [{"table": 'sales."Orders;"', "privilege": "INSERT", "grantable": True}],
            }
        ],
        "changes": ["REVOKE INSERT"],
    }
    released = FenceReleased("app", True, (grant,), "off", (ORDERS,))
    assert released.to_dict()["missing_tables"] == ['sales."Orders;"']
    json.dumps([applied.to_dict(), released.to_dict()])  # plain JSON all the way down


def test_subscription_errors_keep_the_subscription_key() -> None:
    errors = SubscriptionErrors(
        name="sub",
        exists=True,
        sync_workers=(ORDERS,),
        stats_reset=T0,
        skip_lsn=LSN("0/16B3748"),
        not_ready=(RelState(ORDERS, "d", None),),
        conflicts={"insert_exists": 2},
    )
    data = errors.to_dict()
    assert "name" not in data and data["subscription"] == "sub"
    assert data["sync_workers"] == ['sales."Orders;"'] and data["skip_lsn"] == "0/16B3748"
    assert data["not_ready"] == [{"table": 'sales."Orders;"', "state": "d", "lsn": None}]
    assert data["origin_lsn"] is None and data["stats_reset"] == "2026-11-25T03:00:00+00:00"
    json.dumps(data)


def test_records_with_derived_values_add_them_to_the_fields() -> None:
    spill = SlotSpill("s", 2, 2000, 1, 5000, 10, 9000)
    assert spill.to_dict()["largest_transaction_at_least"] == 5000
    status = SubscriptionStatus(
        "sub", True, relations=(RelState(ORDERS, "r", LSN("0/10")), RelState(ORDERS, "d", None))
    )
    data = status.to_dict()
    assert data["state_counts"] == {"r": 1, "d": 1}
    assert data["relations"][0] == {"table": 'sales."Orders;"', "state": "r", "lsn": "0/10"}
    publication = PublicationInfo("p", False, ("insert",), False, (PublishedTable(ORDERS),))
    assert publication.to_dict()["tables"] == [
        {"table": 'sales."Orders;"', "columns": None, "row_filter": None}
    ]
