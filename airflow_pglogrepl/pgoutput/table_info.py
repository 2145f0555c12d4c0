"""A table as the decoder knows it: its columns, and how their raw values become Python values.

pgoutput describes a table once per decoding session (a Relation message), and again after DDL;
``RelationCache`` builds a ``TableInfo`` from each description, and every ``Change`` keeps the
version that was current when it was decoded, so its values are converted with the columns they
were sent with. The columnar decoder, the changelog's Arrow types and the snapshot's block copy
read the same descriptions, and the tests' test_decoding parser builds them from text (its old
tuples leave out NULL columns: ``ABSENT``). The converters are built once per table version;
they are closures, so a ``TableInfo`` is pickled as its description and rebuilt on the other
side (Spark executors, spill files).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.pgoutput.binary import binary_converter
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST, Binary
from airflow_pglogrepl.pgoutput.oids import Converter
from airflow_pglogrepl.pgoutput.tuples import row_parser, tuple_parser
from airflow_pglogrepl.pgoutput.values import text_converter, text_converter_for_bytes

__all__ = ["ABSENT", "ColumnInfo", "TableInfo"]


class _Absent:
    """An old-tuple column the plugin did not print (test_decoding skips NULLs of old tuples)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


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
