"""What a drain consumes: one ``Change`` per row change, plus transaction boundaries and messages.

``PgOutputStream`` produces these records (and the tests' decoder of test_decoding's text
output the same ones, to compare the two plugins). Events come in commit order:
``TransactionBegin``, the transaction's ``Change`` and transactional ``LogicalMessage`` records
(``seq`` 0, 1, 2 ...), then ``TransactionCommit``, whose ``end_lsn`` is where the slot may be
advanced once everything before it is durably stored.

A ``Change`` keeps its columns as the raw text the server sent and converts them to Python
values the first time ``new`` or ``old`` is read: decoding stays cheap when a consumer only routes
or counts changes, or converts whole columns at once (``raw_new``/``raw_old`` with ``schema``).
How a column is converted is its table's description's (``table_info.TableInfo``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST
from airflow_pglogrepl.pgoutput.table_info import TableInfo

__all__ = [
    "Change",
    "Event",
    "LogicalMessage",
    "Op",
    "TransactionBegin",
    "TransactionCommit",
]

Op: TypeAlias = Literal["I", "U", "D", "T"]


class _Unset:
    """A lazily computed attribute that has not been computed yet."""


_UNSET: Final = _Unset()

# Change._flags bits
FLAG_CASCADE: Final = 1
FLAG_RESTART_IDENTITY: Final = 2
FLAG_OLD_IS_KEY: Final = 4


@dataclass(frozen=True, slots=True)
class TransactionBegin:
    """A committed transaction's changes follow.

    ``commit_lsn`` is the LSN of the commit record (pgoutput; test_decoding does not print it, so
    it is None there). For a two-phase transaction ``gid`` is its global id and the commit is the
    COMMIT PREPARED.
    """

    xid: int
    commit_lsn: LSN | None
    commit_ts: dt.datetime | None
    gid: str | None = None


@dataclass(frozen=True, slots=True)
class TransactionCommit:
    """The transaction announced by the last ``TransactionBegin`` is complete.

    ``end_lsn`` is just past its commit record: advance the slot there once everything up to here
    is durably stored. ``count`` is how many records (changes and transactional messages) it had.
    """

    xid: int
    commit_lsn: LSN | None
    end_lsn: LSN
    commit_ts: dt.datetime | None
    count: int
    gid: str | None = None
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` message.

    Transactional ones belong to a committed transaction (``transaction`` and ``seq`` set, and
    delivered in its place); non-transactional ones are delivered as they were decoded, alone.
    """

    lsn: LSN
    transactional: bool
    prefix: str
    content: bytes
    transaction: TransactionBegin | None = None
    seq: int | None = None

    @property
    def xid(self) -> int | None:
        return None if self.transaction is None else self.transaction.xid


class Change:
    """One row change (``op`` I/U/D) or one table's truncation (``T``) in a committed transaction.

    ``new``: the row after INSERT/UPDATE; ``old``: the old key (only replica identity columns) or
    the whole old row (REPLICA IDENTITY FULL) for UPDATE/DELETE when the server sent it, else
    None. Columns an UPDATE left as unchanged TOASTed values are absent from ``new`` and named in
    ``unchanged_toast`` (their value is whatever the row held before; it is not NULL).
    ``seq`` numbers the records of a transaction from 0. ``lsn`` is the change's own WAL position.
    """

    __slots__ = ("_flags", "_new", "_new_v", "_old", "_old_v", "lsn", "op", "seq", "table",
                 "transaction")  # fmt: skip

    op: Op
    table: TableInfo
    transaction: TransactionBegin
    lsn: LSN
    seq: int
    _new: Sequence[Any] | None
    _old: Sequence[Any] | None
    _flags: int
    _new_v: dict[str, Any] | _Unset | None
    _old_v: dict[str, Any] | _Unset | None

    def __init__(
        self,
        op: Op,
        table: TableInfo,
        transaction: TransactionBegin,
        lsn: LSN,
        seq: int,
        new: Sequence[Any] | None,
        old: Sequence[Any] | None,
        flags: int = 0,
    ) -> None:
        self.op = op
        self.table = table
        self.transaction = transaction
        self.lsn = lsn
        self.seq = seq
        self._new = new
        self._old = old
        self._flags = flags
        self._new_v = self._old_v = _UNSET

    # -- transaction ----------------------------------------------------------------------

    @property
    def xid(self) -> int:
        return self.transaction.xid

    @property
    def commit_lsn(self) -> LSN | None:
        return self.transaction.commit_lsn

    @property
    def commit_ts(self) -> dt.datetime | None:
        return self.transaction.commit_ts

    # -- table ----------------------------------------------------------------------------

    @property
    def relation(self) -> tuple[str, str]:
        """``(schema, table)``."""
        return (self.table.schema, self.table.table)

    # -- row ------------------------------------------------------------------------------

    @property
    def new(self) -> dict[str, Any] | None:
        value = self._new_v
        if value is _UNSET:
            raw = self._new
            table = self.table
            if raw.__class__ is list:  # text columns only: the table's generated builder
                try:
                    value = table._build(*raw)
                except (ValueError, TypeError, KeyError, ArithmeticError, IndexError) as exc:
                    raise table._conversion_error(raw, exc, self.op) from exc
            else:
                value = None if raw is None else table.values(raw, op=self.op)
            self._new_v = value
        return value  # type: ignore[return-value]

    @property
    def old(self) -> dict[str, Any] | None:
        value = self._old_v
        if value is _UNSET:
            raw = self._old
            value = (
                None
                if raw is None
                else self.table.values(
                    raw, key_only=bool(self._flags & FLAG_OLD_IS_KEY), op=self.op
                )
            )
            self._old_v = value
        return value  # type: ignore[return-value]

    @property
    def raw_new(self) -> Sequence[Any] | None:
        """The new tuple as sent, in column order (None, UNCHANGED_TOAST, bytes/str, Binary)."""
        return self._new

    @property
    def raw_old(self) -> Sequence[Any] | None:
        """The old tuple as sent (for a key, non-key columns are None)."""
        return self._old

    @property
    def unchanged_toast(self) -> frozenset[str]:
        raw = self._new if self._new is not None else self._old
        if raw is None or UNCHANGED_TOAST not in raw:
            return frozenset()
        names = self.table.names
        return frozenset(n for n, v in zip(names, raw, strict=True) if v is UNCHANGED_TOAST)

    @property
    def cascade(self) -> bool:
        """TRUNCATE ... CASCADE."""
        return bool(self._flags & FLAG_CASCADE)

    @property
    def restart_identity(self) -> bool:
        """TRUNCATE ... RESTART IDENTITY."""
        return bool(self._flags & FLAG_RESTART_IDENTITY)

    # -- value semantics ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every public field, values converted (for comparisons, logs and JSON-ish sinks)."""
        return {
            "op": self.op,
            "relation": self.relation,
            "xid": self.xid,
            "lsn": self.lsn,
            "seq": self.seq,
            "commit_lsn": self.commit_lsn,
            "commit_ts": self.commit_ts,
            "new": self.new,
            "old": self.old,
            "unchanged_toast": self.unchanged_toast,
            "cascade": self.cascade,
            "restart_identity": self.restart_identity,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Change):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [f"{self.op} {self.table.schema}.{self.table.table}", f"xid={self.xid}",
                 f"lsn={self.lsn}", f"seq={self.seq}"]  # fmt: skip
        if self._old is not None:
            parts.append(f"old={self.old!r}")
        if self._new is not None:
            parts.append(f"new={self.new!r}")
        if self.unchanged_toast:
            parts.append(f"unchanged_toast={sorted(self.unchanged_toast)}")
        if self.op == "T":
            parts.append(f"cascade={self.cascade} restart_identity={self.restart_identity}")
        return f"Change({', '.join(parts)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            Change,
            (
                self.op,
                self.table,
                self.transaction,
                self.lsn,
                self.seq,
                self._new,
                self._old,
                self._flags,
            ),
        )


Event: TypeAlias = TransactionBegin | Change | LogicalMessage | TransactionCommit
