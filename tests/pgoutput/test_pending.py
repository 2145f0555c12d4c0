"""The first pending transaction in a slot's pgoutput rows, and its record."""

from __future__ import annotations

from typing import Any

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.operators.conflicts import describe_pending
from airflow_pglogrepl.pgoutput.messages import (
    BeginMessage,
    CommitMessage,
    DeleteMessage,
    InsertMessage,
    TruncateMessage,
    UpdateMessage,
)
from airflow_pglogrepl.pgoutput.pending import PendingTransaction, first_pending_transaction
from airflow_pglogrepl.tables import TableRef
from tests.support.cutover import HOSTILE
from tests.support.pgoutput_encoder import T0, encode, relation

# -- conflicts -------------------------------------------------------------------------------------


def _pgoutput(*messages: Any) -> list[bytes]:
    return [encode(m) for m in messages]


def _txn(xid: int, final: int, end: int, *body: Any) -> list[Any]:
    return [BeginMessage(LSN(final), T0, xid), *body, CommitMessage(0, LSN(final), LSN(end), T0)]


def test_first_pending_transaction_passes_over_applied_ones() -> None:
    orders = relation(16400, "orders", [("id", 23, True)])
    other = relation(16401, HOSTILE.name, [("id", 23, True)], namespace=HOSTILE.schema)
    rows = _pgoutput(
        *_txn(700, 0x1000, 0x1040, orders, InsertMessage(None, 16400, (b"1",))),
        *_txn(
            701, 0x2000, 0x2040, other,
            InsertMessage(None, 16401, (b"1",)), InsertMessage(None, 16401, (b"2",)),
            UpdateMessage(None, 16400, None, None, (b"1",)),
            DeleteMessage(None, 16400, "K", (b"1",)), TruncateMessage(None, 0, (16401,)),
        ),
    )  # fmt: skip
    pending = first_pending_transaction(rows, applied_upto=LSN(0x1040))
    assert pending is not None and pending.complete
    assert (pending.xid, pending.finish_lsn) == (701, LSN(0x2000))
    assert pending.changes == (
        (HOSTILE, "insert", 2), (TableRef("public", "orders"), "update", 1),
        (TableRef("public", "orders"), "delete", 1), (HOSTILE, "truncate", 1),
    )  # fmt: skip
    assert pending.tables == (HOSTILE, TableRef("public", "orders"))
    first = first_pending_transaction(rows, applied_upto=None)
    assert first is not None and first.xid == 700
    assert first_pending_transaction(rows, applied_upto=LSN(0x2040)) is None


def test_first_pending_transaction_read_in_part() -> None:
    rows = _pgoutput(BeginMessage(LSN(0x3000), T0, 9), relation(1, "t", [("id", 23)]),
                     InsertMessage(None, 1, (b"1",)))  # fmt: skip
    pending = first_pending_transaction(rows, applied_upto=LSN(0x2000))
    assert pending is not None and not pending.complete
    text = describe_pending(pending)
    assert "finish LSN 0/3000, read in part" in text and "public.t (1 insert)" in text


def test_pending_transaction_record() -> None:
    pending = PendingTransaction(5, LSN("0/10"), T0, ((HOSTILE, "insert", 1),), complete=True)
    data = pending.to_dict()
    assert data["finish_lsn"] == "0/10" and data["tables"] == [str(HOSTILE)]
    assert data["changes"] == [{"table": str(HOSTILE), "kind": "insert", "count": 1}]
