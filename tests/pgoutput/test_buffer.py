"""InMemoryTransactionBuffer: what a subtransaction's abort drops; and what a committed
transaction's waiting items become."""

from __future__ import annotations

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import InMemoryTransactionBuffer
from airflow_pglogrepl.pgoutput.buffer import Pending, deliver
from airflow_pglogrepl.pgoutput.changes import (
    FLAG_OLD_IS_KEY,
    Change,
    LogicalMessage,
    TransactionBegin,
    TransactionCommit,
)
from airflow_pglogrepl.pgoutput.oids import OID
from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from tests.support.pgoutput_encoder import T0


def test_in_memory_buffer_subtransaction_rules() -> None:
    buffer = InMemoryTransactionBuffer()
    for sub, item in [(1, "a"), (2, "b"), (3, "c"), (2, "d"), (4, "e")]:
        buffer.append("t", sub, item)
    buffer.abort_subtransaction("t", 3)
    assert list(buffer.pop("t")) == ["a", "b"]
    buffer.open("empty")
    assert "empty" in buffer and list(buffer.pop("empty")) == []
    buffer.abort_subtransaction("missing", 1)
    buffer.discard("missing")
    assert buffer.keys() == []


def test_a_committed_transaction_is_delivered_in_order_and_counted() -> None:
    table = TableInfo("public", "t", [ColumnInfo("id", OID.INT4)], relation_id=7)
    begin = TransactionBegin(9, LSN(0x200), T0, "gid-1")
    items: list[Pending] = [
        ("I", table, LSN(0x110), [b"1"], None, 0),
        ("M", None, LSN(0x120), "prefix", b"content", 1),
        ("D", table, LSN(0x130), None, [b"1"], FLAG_OLD_IS_KEY),
    ]
    events = list(deliver(begin, items, LSN(0x300), "origin-a"))
    assert events[0] is begin
    insert, message, delete = events[1:4]
    assert isinstance(insert, Change) and isinstance(delete, Change)
    assert (insert.op, insert.seq, insert.lsn, insert.transaction) == ("I", 0, LSN(0x110), begin)
    assert message == LogicalMessage(LSN(0x120), True, "prefix", b"content", begin, 1)
    assert (delete.op, delete.seq, delete.new) == ("D", 2, None)
    assert events[4] == TransactionCommit(9, LSN(0x200), LSN(0x300), T0, 3, "gid-1", "origin-a")
    assert len(events) == 5


def test_an_empty_transaction_is_its_begin_and_commit() -> None:
    begin = TransactionBegin(9, LSN(0x200), T0)
    assert list(deliver(begin, [], LSN(0x300), None)) == [
        begin,
        TransactionCommit(9, LSN(0x200), LSN(0x300), T0, 0, None, None),
    ]
