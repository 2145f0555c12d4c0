"""The lake's types: Arrow (and so Delta/Spark) types for decoded PostgreSQL columns.

The lake stores typed columns: a table's Arrow schema follows from the decoder's ``TableInfo``
(type OIDs and modifiers from the Relation message), and ``arrow_value`` turns what the
decoder's ``values`` produced into what ``pyarrow.array`` accepts for that type. The decoder
(``pgoutput/``) knows nothing of Arrow; the drain and the snapshot both type through here.
Choices where Arrow has no exact match (docs/types.md has the whole table):

- every integer type (``smallint``, ``integer``, ``bigint``) is ``int64``: ``ALTER COLUMN ...
  TYPE bigint``, the type change tables actually go through when ids run out, then changes
  nothing in the lake (Delta Lake could only widen a column through a table feature that not
  every reader has);
- ``numeric(p, s)`` up to 38 digits is ``decimal128(38, s)``, whatever ``p``: raising the
  precision (the usual ``numeric`` change) keeps the lake type too. Its ``NaN`` (the one special
  value such a column accepts) is NULL: a decimal has no NaN, and Debezium's decimal mode does
  the same. Unconstrained ``numeric``, and any that cannot be a Delta decimal, is ``string``
  holding the exact text, ``NaN`` and ``Infinity`` included;
- ``date`` and timestamps keep their Arrow types, with BC and far-future values exact and
  ``infinity`` as the storage's extreme values; ``time`` is ``int64`` microseconds since
  midnight (Delta has no time type). See ``changelog.temporal``;
- ``interval`` is ``struct<months int32, days int32, microseconds int64>``: Parquet cannot store
  Arrow's month-day-nano interval, and months and days are not fixed lengths of time;
- ``uuid``, ``inet``, ``cidr``, ``json`` and ``jsonb`` are ``string``; ``json``/``jsonb`` hold the
  text PostgreSQL printed, unparsed;
- arrays are ``list<element>``; a multi-dimensional array is stored flattened, in PostgreSQL's
  storage order (the element type says nothing of the dimension count);
- every other type (``timetz``, ``money``, ``bit``, enums, ranges, geometric types, ``xml``,
  ``hstore`` ...) is ``string``: PostgreSQL's own text form, exact.

pyarrow is imported inside the functions, so importing the decoder stays light.
"""

from __future__ import annotations

import datetime as dt
import decimal
import ipaddress
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.temporal import date_days, time_micros, timestamp_micros
from airflow_pglogrepl.pgoutput.values import ARRAY_ELEMENT, OID, Interval, text_converter

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo

__all__ = [
    "TYPE_META",
    "arrow_field",
    "arrow_from_text_array",
    "arrow_from_texts",
    "arrow_schema",
    "arrow_type",
    "arrow_value",
    "column_type",
    "numeric_precision_scale",
]

# Field metadata: "<type OID>:<type modifier>" of the PostgreSQL type a column's values were
# converted as (OID 0: kept as text). What turns a catalog default into the column's lake value.
TYPE_META = "pglogrepl.type"

_VARHDRSZ = 4
_DECIMAL_MAX = 38  # Delta Lake's (and Spark's) largest decimal precision


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric(p, s)`` type modifier; None when unconstrained.

    The modifier is ``((p << 16) | (s & 0x7ff)) + 4``, the scale an 11-bit signed number
    (PostgreSQL 15 allows negative scales and scales above the precision).
    """
    if type_modifier < _VARHDRSZ:
        return None
    packed = type_modifier - _VARHDRSZ
    precision = (packed >> 16) & 0xFFFF
    scale = ((packed & 0x7FF) ^ 0x400) - 0x400
    return precision, scale


def is_decimal(bounds: tuple[int, int] | None) -> bool:
    """Whether ``numeric`` of these ``(precision, scale)`` is a decimal column in the lake."""
    return bounds is not None and 0 <= bounds[1] <= bounds[0] <= _DECIMAL_MAX


def arrow_type(type_oid: int | None, type_modifier: int = -1) -> pa.DataType:
    """The Arrow type for values of a built-in type (``string`` for any other)."""
    import pyarrow as pa

    element = ARRAY_ELEMENT.get(type_oid) if type_oid is not None else None
    if element is not None:
        return pa.list_(arrow_type(element, type_modifier))
    if type_oid == OID.NUMERIC:
        bounds = numeric_precision_scale(type_modifier)
        if is_decimal(bounds):
            assert bounds is not None
            return pa.decimal128(_DECIMAL_MAX, bounds[1])
        return pa.string()
    simple = {
        OID.BOOL: pa.bool_(),
        OID.BYTEA: pa.binary(),
        OID.INT2: pa.int64(),
        OID.INT4: pa.int64(),
        OID.INT8: pa.int64(),
        OID.FLOAT4: pa.float32(),
        OID.FLOAT8: pa.float64(),
        OID.DATE: pa.date32(),
        OID.TIME: pa.int64(),  # microseconds since midnight
        OID.TIMESTAMP: pa.timestamp("us"),
        OID.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
        OID.INTERVAL: pa.struct(
            [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())]
        ),
    }
    return simple.get(type_oid, pa.string()) if type_oid is not None else pa.string()


def arrow_field(column: ColumnInfo) -> pa.Field:
    """A nullable Arrow field for one column, typed by the type its values are converted as."""
    import pyarrow as pa

    oid, modifier = column.value_type_oid, column.type_modifier
    return pa.field(
        column.name, arrow_type(oid, modifier), metadata={TYPE_META: f"{oid or 0}:{modifier}"}
    )


def column_type(field: pa.Field) -> tuple[int | None, int]:
    """``(value type OID or None, type modifier)`` recorded in a field by ``arrow_field``."""
    text = (field.metadata or {}).get(TYPE_META.encode(), b"0:-1").decode()
    oid, _, modifier = text.partition(":")
    return (int(oid) or None), int(modifier)


def arrow_schema(table: TableInfo) -> pa.Schema:
    """The Arrow schema of a table's rows, columns in table order."""
    import pyarrow as pa

    metadata = {b"postgres.relation": f"{table.schema}.{table.table}".encode()}
    return pa.schema([arrow_field(c) for c in table.columns], metadata=metadata)


def arrow_value(value: Any, type_oid: int | None, type_modifier: int = -1) -> Any:
    """A decoded value as ``pyarrow.array`` takes it for ``arrow_type(type_oid, type_modifier)``.

    :raises ValueError: the value has no representation in that Arrow type (a timestamp after
        294247-01-10; anything the decoder could not have produced for the type).
    """
    if value is None:
        return None
    element = ARRAY_ELEMENT.get(type_oid) if type_oid is not None else None
    if element is not None:
        return [arrow_value(item, element, type_modifier) for item in _flat(value)]
    if type_oid == OID.NUMERIC:
        if not is_decimal(numeric_precision_scale(type_modifier)):
            return format(value, "f")  # as numeric_out prints it: never an exponent
        if isinstance(value, decimal.Decimal) and value.is_nan():
            return None  # a decimal has no NaN (documented)
        if not isinstance(value, decimal.Decimal) or not value.is_finite():
            raise ValueError(f"numeric {value!r} cannot be stored in an Arrow decimal column")
        return value
    if isinstance(value, Interval):
        return {"months": value.months, "days": value.days, "microseconds": value.microseconds}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, ipaddress.IPv4Interface | ipaddress.IPv6Interface):
        full = value.network.prefixlen == value.max_prefixlen
        return str(value.ip) if full else str(value)  # as inet_out prints it
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return str(value)
    if type_oid == OID.TIME:
        return time_micros(value)
    if isinstance(value, str):
        if type_oid == OID.DATE:
            return date_days(value)
        if type_oid in (OID.TIMESTAMP, OID.TIMESTAMPTZ):
            return timestamp_micros(value)
    if isinstance(value, dt.datetime) and type_oid == OID.TIMESTAMPTZ:
        return value.astimezone(dt.UTC)
    return value


class UnconvertibleTextError(ValueError):
    """One value of PostgreSQL's text that its column's lake type cannot take."""

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(f"{text!r}: {reason}")


def arrow_from_texts(
    texts: Sequence[str | None], type_oid: int | None, type_modifier: int, target: pa.DataType
) -> pa.Array:
    """A column given as PostgreSQL's text, converted value by value exactly as the drain's
    decoder and ``arrow_value`` convert it (the slow path of the snapshot and of the columnar
    decoder, for types and values no vectorized cast reads the same way).

    :raises UnconvertibleTextError: naming the first value that does not convert.
    """
    import pyarrow as pa

    convert = text_converter(type_oid) if type_oid is not None else None
    out: list[Any] = []
    for text in texts:
        if text is None:
            out.append(None)
            continue
        try:
            out.append(arrow_value(convert(text) if convert else text, type_oid, type_modifier))
        except ValueError as exc:
            raise UnconvertibleTextError(text, str(exc)) from None
    return pa.array(out, type=target)


# Types whose text needs no conversion: what PostgreSQL printed is the lake value.
TEXT_KEPT = frozenset({None, OID.TEXT, OID.VARCHAR, OID.BPCHAR, OID.NAME, OID.JSON, OID.JSONB,
                       OID.UUID})  # fmt: skip
# Types ``pyarrow.compute.cast`` reads from their text into exactly what ``arrow_value`` makes
# of the converters' values; any value the cast refuses (``infinity``, a BC date, ``NaN``) goes
# value by value instead.
_CAST = frozenset({OID.INT2, OID.INT4, OID.INT8, OID.FLOAT4, OID.FLOAT8, OID.DATE,
                   OID.TIMESTAMP, OID.TIMESTAMPTZ, OID.NUMERIC})  # fmt: skip


def arrow_from_text_array(
    texts: pa.Array, type_oid: int | None, type_modifier: int, target: pa.DataType
) -> pa.Array:
    """A whole ``string`` column of PostgreSQL's text as the column's lake values: the one
    text-to-lake mapping the columnar decoder and the snapshot share. Vectorized where a
    ``pyarrow.compute`` cast reads the text the way the converters do; otherwise, and for a
    column holding any value the cast refuses, ``arrow_from_texts``.

    :raises UnconvertibleTextError: naming the first value the lake type cannot take.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if type_oid in TEXT_KEPT:
        return texts
    if type_oid == OID.BOOL:
        sent = texts.drop_null()
        if not len(sent) or pc.all(pc.is_in(sent, value_set=pa.array(["t", "f"]))).as_py():
            return pc.equal(texts, "t")
    elif type_oid in _CAST:
        try:
            if type_oid == OID.FLOAT4:  # read as a double, rounded as pa.array rounds a float
                return pc.cast(texts, pa.float64()).cast(pa.float32(), safe=False)
            return pc.cast(texts, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # a value the cast cannot read the converters' way: value by value below
    return arrow_from_texts(texts.to_pylist(), type_oid, type_modifier, target)


def _flat(value: list[Any]) -> list[Any]:
    """An array's elements in storage order, however many dimensions it has."""
    if not any(isinstance(item, list) for item in value):
        return value
    flat: list[Any] = []
    for item in value:
        flat.extend(_flat(item) if isinstance(item, list) else [item])
    return flat
