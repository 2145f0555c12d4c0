"""Where not-yet-committed transactions wait: the decoder's only memory that grows with data.

Changes of a streamed transaction arrive before anyone knows whether it commits, and a prepared
transaction's changes arrive before its COMMIT PREPARED; test_decoding prints a transaction's
commit time only after its changes. All of them wait here, behind a small interface, so that a
later implementation can spill to disk without touching the decoders. Items are opaque to the
buffer (small tuples the decoder builds, ``Pending``); they are picklable, for such a spilling
buffer. ``deliver`` turns a committed transaction's items into its events.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.changes import (
    Change,
    Event,
    LogicalMessage,
    TransactionBegin,
    TransactionCommit,
)
from airflow_pglogrepl.pgoutput.table_info import TableInfo

__all__ = ["InMemoryTransactionBuffer", "Pending", "Prepared", "TransactionBuffer", "deliver"]

# The items the stream keeps here are tuples:
#   (op, table, lsn, new, old, flags) for I/U/D/T, and ("M", None, lsn, prefix, content, 1).
Pending = tuple[str, TableInfo | None, LSN, Any, Any, int]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepared transaction waiting for COMMIT or ROLLBACK PREPARED."""

    xid: int
    gid: str
    prepare_lsn: LSN
    end_lsn: LSN
    origin: str | None


class TransactionBuffer(Protocol):
    """Ordered items per open transaction, with sub-transaction rollback."""

    def open(self, key: Hashable) -> None:
        """Start an empty entry (a transaction may end with no items at all)."""

    def append(self, key: Hashable, subxid: int, item: Any) -> None:
        """Add an item made by (sub)transaction ``subxid`` to the end of ``key``'s entry."""

    def abort_subtransaction(self, key: Hashable, subxid: int) -> None:
        """Drop ``subxid``'s items and everything appended after its first one.

        Sub-transactions nest, so whatever follows a sub-transaction's first change in a stream
        belongs to it or to its children until it aborts (the rule PostgreSQL's own apply worker
        uses: it truncates its spool file at that change).
        """

    def rename(self, key: Hashable, new_key: Hashable) -> None:
        """Move an entry (a streamed transaction that was prepared is then found by its gid)."""

    def pop(self, key: Hashable) -> Sequence[Any]:
        """Remove the entry and return its items in order."""

    def discard(self, key: Hashable) -> None:
        """Remove the entry, if any, dropping its items."""

    def __contains__(self, key: object) -> bool: ...

    def keys(self) -> list[Hashable]:
        """The open entries."""

    def total_items(self) -> int:
        """Items held across all entries (for metrics and memory limits)."""


class InMemoryTransactionBuffer:
    """``TransactionBuffer`` on Python lists: fine while open transactions fit in memory."""

    def __init__(self) -> None:
        self._items: dict[Hashable, list[Any]] = {}
        # key -> {subxid: index of its first item}, in first-appearance order
        self._first: dict[Hashable, dict[int, int]] = {}

    def open(self, key: Hashable) -> None:
        self._items.setdefault(key, [])
        self._first.setdefault(key, {})

    def append(self, key: Hashable, subxid: int, item: Any) -> None:
        items = self._items.get(key)
        if items is None:
            self.open(key)
            items = self._items[key]
        first = self._first[key]
        if subxid not in first:
            first[subxid] = len(items)
        items.append(item)

    def abort_subtransaction(self, key: Hashable, subxid: int) -> None:
        first = self._first.get(key)
        if first is None or subxid not in first:
            return  # the sub-transaction changed nothing we kept
        cut = first[subxid]
        del self._items[key][cut:]
        for other in [x for x, index in first.items() if index >= cut]:
            del first[other]

    def rename(self, key: Hashable, new_key: Hashable) -> None:
        self.open(key)
        self._items[new_key] = self._items.pop(key)
        self._first[new_key] = self._first.pop(key)

    def pop(self, key: Hashable) -> Sequence[Any]:
        self._first.pop(key, None)
        return self._items.pop(key, [])

    def discard(self, key: Hashable) -> None:
        self._items.pop(key, None)
        self._first.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def keys(self) -> list[Hashable]:
        return list(self._items)

    def total_items(self) -> int:
        return sum(len(items) for items in self._items.values())


def deliver(
    begin: TransactionBegin,
    items: Iterable[Pending],
    end_lsn: LSN,
    origin: str | None,
) -> Iterator[Event]:
    """A committed transaction's events: its Begin, its waiting items as ``Change`` and
    ``LogicalMessage`` records numbered from 0, then its Commit."""
    yield begin
    seq = 0
    for op, table, lsn, new, old, flags in items:
        if op == "M":
            yield LogicalMessage(lsn, True, new, old, begin, seq)
        else:
            assert table is not None
            yield Change(op, table, begin, lsn, seq, new, old, flags)  # type: ignore[arg-type]
        seq += 1
    yield TransactionCommit(
        begin.xid, begin.commit_lsn, end_lsn, begin.commit_ts, seq, begin.gid, origin
    )
