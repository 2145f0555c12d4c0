"""InMemoryTransactionBuffer: what a subtransaction's abort drops."""

from __future__ import annotations

from airflow_pglogrepl.pgoutput import InMemoryTransactionBuffer


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
