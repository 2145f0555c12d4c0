"""What a drain consumes: one ``Change`` per row change, plus transaction boundaries and messages.

``PgOutputStream`` produces these records (and the tests' decoder of test_decoding's text
output the same ones, to compare the two plugins). Events come in commit order:
``TransactionBegin``, the transaction's ``Change`` and transactional ``LogicalMessage`` records
(``seq`` 0, 1, 2 ...), then ``TransactionCommit``, whose ``end_lsn`` is where the slot may be
advanced once everything before it is durably stored.

A ``Change`` keeps its columns as the raw text the server sent and converts them to Python
values the first time ``new`` or ``old`` is read: decoding stays cheap when a consumer only routes
or counts changes, or converts whole columns at once (``raw_new``/``raw_old`` with ``schema``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.binary import binary_converter
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST, Binary
from airflow_pglogrepl.pgoutput.oids import Converter
from airflow_pglogrepl.pgoutput.tuples import row_parser, tuple_parser
from airflow_pglogrepl.pgoutput.values import text_converter, text_converter_for_bytes

__all__ = [
    "ABSENT",
    "Change",
    "ColumnInfo",
    "Event",
    "LogicalMessage",
    "Op",
    "TableInfo",
    "TransactionBegin",
    "TransactionCommit",
]

Op: TypeAlias = Literal["I", "U", "D", "T"]


class _Absent:
    """An old-tuple column the plugin did not print (test_decoding skips NULLs of old tuples)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


class _Unset:
    """A lazily computed attribute that has not been computed yet."""


_UNSET: Final = _Unset()

# Change._flags bits
FLAG_CASCADE: Final = 1
FLAG_RESTART_IDENTITY: Final = 2
FLAG_OLD_IS_KEY: Final = 4


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column as the decoder knows it.

    ``type_oid`` is the column's type as sent (a domain's own OID); ``value_type_oid`` is the
    built-in type its values are converted as (the domain's base type), or None when they stay
    text. ``type_modifier`` is -1 when unknown (test_decoding does not print it).
    """

    name: str
    type_oid: int
    type_modifier: int = -1
    is_key: bool = False
    value_type_oid: int | None = None
    type_name: str | None = None


class TableInfo:
    """One version of a table's description: its columns and how to convert their values.

    pgoutput describes a table with a Relation message and re-describes it after DDL; every
    ``Change`` keeps the version that was current when it was decoded.
    ``source`` says what raw column values look like: ``"pgoutput"`` (bytes, or ``Binary``) or
    ``"text"`` (``str``, from test_decoding).
    """

    __slots__ = (
        "_binary_converters",
        "_build",
        "_converters",
        "_key_indexes",
        "columns",
        "names",
        "parse",
        "parse_row",
        "relation_id",
        "replica_identity",
        "schema",
        "source",
        "table",
    )

    def __init__(
        self,
        schema: str,
        table: str,
        columns: Sequence[ColumnInfo],
        *,
        relation_id: int | None = None,
        replica_identity: str | None = None,
        source: Literal["pgoutput", "text"] = "pgoutput",
    ) -> None:
        self.schema = schema
        self.table = table
        self.columns = tuple(columns)
        self.relation_id = relation_id
        self.replica_identity = replica_identity
        self.source = source
        self.names = tuple(c.name for c in self.columns)
        # the TupleData reader for this many columns (pgoutput)
        self.parse = tuple_parser(len(self.columns))
        self.parse_row = row_parser(len(self.columns))
        self._key_indexes = tuple(i for i, c in enumerate(self.columns) if c.is_key)
        if source == "pgoutput":
            self._converters = tuple(_bytes_converter(c) for c in self.columns)
            self._binary_converters = tuple(_either_converter(c) for c in self.columns)
        else:
            self._converters = tuple(_str_converter(c) for c in self.columns)
            self._binary_converters = self._converters
        self._build = _value_builder(self.names, self._converters, self._values_slow)

    @property
    def relation(self) -> tuple[str, str]:
        """``(schema, table)``."""
        return (self.schema, self.table)

    @property
    def key_names(self) -> tuple[str, ...]:
        """Columns of the replica identity (all of them under REPLICA IDENTITY FULL)."""
        return tuple(self.names[i] for i in self._key_indexes)

    def values(
        self, raw: Sequence[Any], *, key_only: bool = False, op: str = "?"
    ) -> dict[str, Any]:
        """Column name -> Python value for one raw tuple; unchanged TOAST columns are left out.

        ``key_only`` keeps only replica identity columns (pgoutput's ``K`` old tuples send NULL
        for every other column).
        """
        try:
            if not key_only and raw.__class__ is list and len(raw) == len(self.names):
                return self._build(*raw)  # the common case, straight-line code
            return self._values_slow(raw, key_only)
        except (ValueError, TypeError, KeyError, ArithmeticError, IndexError) as exc:
            raise self._conversion_error(raw, exc, op) from exc

    def _values_slow(self, raw: Sequence[Any], key_only: bool) -> dict[str, Any]:
        converters = self._binary_converters if raw.__class__ is not list else self._converters
        names = self.names
        out: dict[str, Any] = {}
        for i in self._key_indexes if key_only else range(len(names)):
            value = raw[i]
            if value is None:
                out[names[i]] = None
            elif value is not UNCHANGED_TOAST and value is not ABSENT:
                out[names[i]] = converters[i](value)
        return out

    def _conversion_error(self, raw: Sequence[Any], exc: Exception, op: str) -> DecodeError:
        for i, column in enumerate(self.columns):
            value = raw[i] if i < len(raw) else None
            if value is None or value is UNCHANGED_TOAST or value is ABSENT:
                continue
            try:
                self._binary_converters[i](value)
            except Exception:
                shown = value if isinstance(value, str) else bytes(value)
                return DecodeError(
                    op,
                    0,
                    f"column {column.name!r} of {self.schema}.{self.table} (type "
                    f"{column.type_name or column.type_oid}): cannot convert {shown[:60]!r}: "
                    f"{exc}. PostgreSQL's default DateStyle (ISO) and IntervalStyle (postgres) "
                    f"are expected in the decoding session",
                )
        return DecodeError(op, 0, f"{self.schema}.{self.table}: {exc}")

    def __reduce__(self) -> tuple[Any, ...]:
        # converters are closures; rebuild them on the other side (Spark executors, spill files)
        return (
            _rebuild_table,
            (
                self.schema,
                self.table,
                self.columns,
                self.relation_id,
                self.replica_identity,
                self.source,
            ),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TableInfo):
            return NotImplemented
        return (
            self.schema,
            self.table,
            self.columns,
            self.relation_id,
            self.replica_identity,
            self.source,
        ) == (
            other.schema,
            other.table,
            other.columns,
            other.relation_id,
            other.replica_identity,
            other.source,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"TableInfo({self.schema}.{self.table}, oid={self.relation_id}, "
            f"columns={list(self.names)})"
        )


def _value_builder(
    names: Sequence[str],
    converters: Sequence[Converter],
    slow: Callable[[Sequence[Any], bool], dict[str, Any]],
) -> Callable[..., dict[str, Any]]:
    """``f(*raw) -> {name: value}`` for a row with no unchanged TOAST (or absent) column.

    Generated once per table version as one dict display, the fastest way CPython builds a dict;
    column names and converters are passed in as variables, never written into the code. A row
    holding an unchanged-TOAST (or absent) marker is handed to ``slow``.
    """
    count = len(names)
    args = ", ".join(f"v{i}" for i in range(count))
    items = ", ".join(f"n{i}: None if v{i} is None else c{i}(v{i})" for i in range(count))
    markers = " or ".join(f"v{i} is U or v{i} is A" for i in range(count)) or "False"
    code = (
        f"def build({args}):\n"
        f"    if {markers}:\n"
        f"        return slow([{args}{',' if count == 1 else ''}], False)\n"
        f"    return {{{items}}}\n"
    )
    namespace: dict[str, Any] = {"slow": slow, "U": UNCHANGED_TOAST, "A": ABSENT}
    for i, (name, conv) in enumerate(zip(names, converters, strict=True)):
        namespace[f"n{i}"] = name
        namespace[f"c{i}"] = conv
    exec(code, namespace)  # generated from column positions only; names are variables
    build: Callable[..., dict[str, Any]] = namespace["build"]
    return build


def _rebuild_table(
    schema: str,
    table: str,
    columns: tuple[ColumnInfo, ...],
    relation_id: int | None,
    replica_identity: str | None,
    source: Literal["pgoutput", "text"],
) -> TableInfo:
    return TableInfo(
        schema,
        table,
        columns,
        relation_id=relation_id,
        replica_identity=replica_identity,
        source=source,
    )


def _bytes_converter(column: ColumnInfo) -> Converter:
    if column.value_type_oid is None:
        return bytes.decode
    return text_converter_for_bytes(column.value_type_oid)


def _either_converter(column: ColumnInfo) -> Converter:
    text = _bytes_converter(column)
    binary = None if column.value_type_oid is None else binary_converter(column.value_type_oid)
    as_binary: Callable[[bytes], Any] = bytes if binary is None else binary

    def convert(raw: bytes) -> Any:
        return as_binary(raw) if raw.__class__ is Binary else text(raw)

    return convert


def _str_converter(column: ColumnInfo) -> Converter:
    conv = None if column.value_type_oid is None else text_converter(column.value_type_oid)
    return str if conv is None else conv


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
