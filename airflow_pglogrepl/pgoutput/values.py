"""Column values: PostgreSQL's text (and binary) forms to Python, by type OID.

pgoutput sends each column in the type's output format (``'t'``) unless the slot is read with
``binary 'true'`` (``'b'``, the type's send format). Both plugins hand us the output of the same
type output functions, so one table of converters serves pgoutput and test_decoding alike. Types
outside the table stay text: converting a value wrongly is worse than not converting it.

``json`` and ``jsonb`` stay text too: parsing would lose what the text says exactly (a ``json``
value's spacing and duplicate keys, a number's digits such as ``1.10`` or ``1e400``).
Values Python's types cannot hold (``'infinity'`` dates and timestamps, BC or year > 9999 dates,
``24:00:00``) are returned as PostgreSQL's text, unchanged, rather than clamped or dropped.
Text forms are parsed as PostgreSQL prints them with its default settings (``DateStyle`` ISO,
``IntervalStyle`` postgres, ``bytea_output`` hex or escape) and a UTF-8 database.
See https://www.postgresql.org/docs/15/datatype.html
"""

from __future__ import annotations

import datetime as dt
import decimal
import ipaddress
import re
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple

__all__ = [
    "ARRAY_ELEMENT",
    "FORMAT_TYPE_NAMES",
    "OID",
    "TYPNAME_OIDS",
    "Interval",
    "binary_converter",
    "from_binary",
    "from_text",
    "text_converter",
    "text_converter_for_bytes",
    "value_type",
]

Converter = Callable[[Any], Any]


class Interval(NamedTuple):
    """An ``interval``: PostgreSQL keeps months, days and microseconds apart (a month is not 30
    days, a day is not always 24 hours), so one ``timedelta`` cannot hold it faithfully."""

    months: int
    days: int
    microseconds: int


class OID:
    """Built-in type OIDs (``pg_type.oid``; fixed across versions, checked by the live tests)."""

    BOOL = 16
    BYTEA = 17
    NAME = 19
    INT8 = 20
    INT2 = 21
    INT4 = 23
    TEXT = 25
    JSON = 114
    CIDR = 650
    FLOAT4 = 700
    FLOAT8 = 701
    INET = 869
    BPCHAR = 1042
    VARCHAR = 1043
    DATE = 1082
    TIME = 1083
    TIMESTAMP = 1114
    TIMESTAMPTZ = 1184
    INTERVAL = 1186
    NUMERIC = 1700
    UUID = 2950
    JSONB = 3802


# array type OID -> element type OID (pg_type.typarray of each element type)
ARRAY_ELEMENT: dict[int, int] = {
    1000: OID.BOOL,
    1001: OID.BYTEA,
    1003: OID.NAME,
    1016: OID.INT8,
    1005: OID.INT2,
    1007: OID.INT4,
    1009: OID.TEXT,
    199: OID.JSON,
    651: OID.CIDR,
    1021: OID.FLOAT4,
    1022: OID.FLOAT8,
    1041: OID.INET,
    1014: OID.BPCHAR,
    1015: OID.VARCHAR,
    1182: OID.DATE,
    1183: OID.TIME,
    1115: OID.TIMESTAMP,
    1185: OID.TIMESTAMPTZ,
    1187: OID.INTERVAL,
    1231: OID.NUMERIC,
    2951: OID.UUID,
    3807: OID.JSONB,
}

# pg_type.typname -> OID, for pgoutput Type messages (a domain's Type message carries the name of
# its base type) and anything else that names a type the catalog way.
TYPNAME_OIDS: dict[str, int] = {
    "bool": OID.BOOL,
    "bytea": OID.BYTEA,
    "name": OID.NAME,
    "int8": OID.INT8,
    "int2": OID.INT2,
    "int4": OID.INT4,
    "text": OID.TEXT,
    "json": OID.JSON,
    "cidr": OID.CIDR,
    "float4": OID.FLOAT4,
    "float8": OID.FLOAT8,
    "inet": OID.INET,
    "bpchar": OID.BPCHAR,
    "varchar": OID.VARCHAR,
    "date": OID.DATE,
    "time": OID.TIME,
    "timestamp": OID.TIMESTAMP,
    "timestamptz": OID.TIMESTAMPTZ,
    "interval": OID.INTERVAL,
    "numeric": OID.NUMERIC,
    "uuid": OID.UUID,
    "jsonb": OID.JSONB,
}
_ELEMENT_TYPNAMES = {oid: name for name, oid in TYPNAME_OIDS.items()}
TYPNAME_OIDS.update({"_" + _ELEMENT_TYPNAMES[elem]: array for array, elem in ARRAY_ELEMENT.items()})

# format_type_be() names (what test_decoding prints between the brackets) -> OID
_FORMAT_NAMES = {
    OID.BOOL: "boolean",
    OID.BYTEA: "bytea",
    OID.NAME: "name",
    OID.INT8: "bigint",
    OID.INT2: "smallint",
    OID.INT4: "integer",
    OID.TEXT: "text",
    OID.JSON: "json",
    OID.CIDR: "cidr",
    OID.FLOAT4: "real",
    OID.FLOAT8: "double precision",
    OID.INET: "inet",
    OID.BPCHAR: "character",
    OID.VARCHAR: "character varying",
    OID.DATE: "date",
    OID.TIME: "time without time zone",
    OID.TIMESTAMP: "timestamp without time zone",
    OID.TIMESTAMPTZ: "timestamp with time zone",
    OID.INTERVAL: "interval",
    OID.NUMERIC: "numeric",
    OID.UUID: "uuid",
    OID.JSONB: "jsonb",
}
FORMAT_TYPE_NAMES: dict[str, int] = {name: oid for oid, name in _FORMAT_NAMES.items()}
FORMAT_TYPE_NAMES.update(
    {_FORMAT_NAMES[elem] + "[]": array for array, elem in ARRAY_ELEMENT.items()}
)


# -- text form --------------------------------------------------------------------------------

_BOOLS = {"t": True, "f": False, "true": True, "false": False}  # boolout; test_decoding spells out


def _bool(text: str) -> bool:
    return _BOOLS[text]


def _bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return _bytea_escape(text)


_ESCAPED = re.compile(r"\\(\\|[0-3][0-7]{2})")


def _bytea_escape(text: str) -> bytes:
    # bytea_output = 'escape': printable ASCII as is, '\\' for a backslash, '\ooo' octal otherwise
    if "\\" not in text:
        return text.encode("latin-1")
    out = bytearray()
    pos = 0
    for match in _ESCAPED.finditer(text):
        out += text[pos : match.start()].encode("latin-1")
        code = match.group(1)
        out.append(0x5C if code == "\\" else int(code, 8))
        pos = match.end()
    rest = text[pos:]
    if "\\" in rest:
        raise ValueError(f"invalid bytea escape in {text[:40]!r}")
    out += rest.encode("latin-1")
    return bytes(out)


_DATE_ISO = dt.date.fromisoformat
_TIME_ISO = dt.time.fromisoformat
_DATETIME_ISO = dt.datetime.fromisoformat


# what PostgreSQL can print but datetime cannot hold: infinities, BC, years beyond 9999
_OUT_OF_RANGE = re.compile(r"-?infinity|\d{4}-\d\d-\d\d.* BC|\d{5,}-\d\d-\d\d.*")


def _out_of_range(text: str) -> bool:
    return _OUT_OF_RANGE.fullmatch(text) is not None


def _special(text: str, what: str) -> str:
    if _out_of_range(text):
        return text
    raise ValueError(f"not an ISO {what}: {text!r}")


def _date(text: str) -> dt.date | str:
    # the C parser first; PostgreSQL's spellings datetime cannot hold only when it refuses
    try:
        return _DATE_ISO(text)
    except ValueError:
        return _special(text, "date")


def _time(text: str) -> dt.time | str:
    try:
        return _TIME_ISO(text)
    except ValueError:
        if text.startswith("24:"):  # PostgreSQL allows 24:00:00; datetime.time does not
            return text
        raise


def _timestamp(text: str) -> dt.datetime | str:
    try:
        return _DATETIME_ISO(text)
    except ValueError:
        return _special(text, "timestamp")


def _date_bytes(raw: bytes) -> dt.date | str:
    try:
        return _DATE_ISO(raw.decode())
    except ValueError:
        return _special(raw.decode(), "date")


def _timestamp_bytes(raw: bytes) -> dt.datetime | str:
    try:
        return _DATETIME_ISO(raw.decode())
    except ValueError:
        return _special(raw.decode(), "timestamp")


_INTERVAL = re.compile(
    r"(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
    r"(?:([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
)


def _interval(text: str) -> Interval:
    # IntervalStyle 'postgres' (the default): '1 year 2 mons -3 days +04:05:06.5'
    match = _INTERVAL.fullmatch(text)
    if match is None or not text:
        raise ValueError(f"not a postgres-style interval: {text!r}")
    years, mons, days, sign, hours, minutes, seconds, fraction = match.groups()
    months = int(years or 0) * 12 + int(mons or 0)
    micros = 0
    if hours is not None:
        micros = (int(hours) * 3600 + int(minutes) * 60 + int(seconds)) * 1_000_000
        if fraction:
            micros += int(fraction.ljust(6, "0"))
        if sign == "-":
            micros = -micros
    return Interval(months, int(days or 0), micros)


def _inet(text: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    return ipaddress.ip_interface(text)


def _cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


def _same(text: str) -> str:
    return text


_TEXT: dict[int, Converter] = {
    OID.BOOL: _bool,
    OID.BYTEA: _bytea,
    OID.NAME: _same,
    OID.INT8: int,
    OID.INT2: int,
    OID.INT4: int,
    OID.TEXT: _same,
    OID.JSON: _same,
    OID.CIDR: _cidr,
    OID.FLOAT4: float,  # float() reads PostgreSQL's NaN, Infinity and -Infinity
    OID.FLOAT8: float,
    OID.INET: _inet,
    OID.BPCHAR: _same,
    OID.VARCHAR: _same,
    OID.DATE: _date,
    OID.TIME: _time,
    OID.TIMESTAMP: _timestamp,
    OID.TIMESTAMPTZ: _timestamp,
    OID.INTERVAL: _interval,
    OID.NUMERIC: Decimal,  # exact; Decimal reads NaN, Infinity and -Infinity too
    OID.UUID: uuid.UUID,
    OID.JSONB: _same,
}


def _array_parser(element: Converter) -> Converter:
    def parse(text: str) -> list[Any]:
        return _parse_array(text, element)

    return parse


def _parse_array(text: str, element: Converter) -> list[Any]:
    """Parse array_out's text: ``{1,2,NULL}``, ``{{1,2},{3,4}}``, ``{"a b","c\\"d"}``.

    A dimension decoration (``[0:1]={1,2}``, printed when a lower bound is not 1) is dropped:
    the elements are kept, in order. The delimiter is ``,`` for every type this module converts.
    See https://www.postgresql.org/docs/15/arrays.html#ARRAYS-IO
    """
    if text.startswith("["):
        text = text[text.index("=") + 1 :]
    if text == "{}":
        return []
    if '"' not in text and "{" not in text[1:]:  # fast path: flat, nothing quoted
        if not (text.startswith("{") and text.endswith("}")):
            raise ValueError(f"not an array: {text[:40]!r}")
        return [None if item == "NULL" else element(item) for item in text[1:-1].split(",")]
    value, pos = _parse_array_level(text, 0, element)
    if pos != len(text):
        raise ValueError(f"trailing text in array at {pos}: {text[:40]!r}")
    return value


def _parse_array_level(text: str, pos: int, element: Converter) -> tuple[list[Any], int]:
    if text[pos] != "{":
        raise ValueError(f"expected '{{' at {pos} in {text[:40]!r}")
    pos += 1
    items: list[Any] = []
    if text[pos] == "}":
        return items, pos + 1
    while True:
        char = text[pos]
        if char == "{":
            sub, pos = _parse_array_level(text, pos, element)
            items.append(sub)
        elif char == '"':
            end = _quote_end(text, pos + 1)
            raw = text[pos + 1 : end]
            items.append(element(_UNESCAPE.sub(r"\1", raw) if "\\" in raw else raw))
            pos = end + 1
        else:
            end = pos
            while text[end] not in ",}":
                end += 1
            item = text[pos:end]
            items.append(None if item == "NULL" else element(item))
            pos = end
        char = text[pos]
        if char == ",":
            pos += 1
        elif char == "}":
            return items, pos + 1
        else:
            raise ValueError(f"expected ',' or '}}' at {pos} in {text[:40]!r}")


_UNESCAPE = re.compile(r"\\(.)", re.DOTALL)


def _quote_end(text: str, pos: int) -> int:
    while True:
        char = text[pos]
        if char == "\\":
            pos += 2
        elif char == '"':
            return pos
        else:
            pos += 1


def text_converter(type_oid: int) -> Converter | None:
    """The ``str -> value`` converter for a type, or None when the type stays text."""
    conv = _TEXT.get(type_oid)
    if conv is not None:
        return conv
    element = ARRAY_ELEMENT.get(type_oid)
    if element is not None:
        return _array_parser(_TEXT[element])
    return None


# pgoutput describes only types past the built-in ones in a Type message (logicalrep_write_typ
# skips OIDs below FirstGenbkiObjectId): below it, a type is its own value type or stays text.
FIRST_DESCRIBED_OID = 10000


def value_type(type_oid: int, base: tuple[str, str] | None) -> int | None:
    """The type a column's values are converted as, the one rule of the drain and the snapshot:
    the column's own type when a converter exists, else a domain's built-in base type, else None
    (the value stays PostgreSQL's text).

    ``base`` is the (namespace, name) that pgoutput's Type message gives for the type (a domain's
    is its base type's, ``getBaseType``), or that the catalog gives the same way; None when unknown.
    """
    if text_converter(type_oid) is not None:
        return type_oid
    if base is not None and type_oid >= FIRST_DESCRIBED_OID and base[0] == "pg_catalog":
        return TYPNAME_OIDS.get(base[1])
    return None


def _decoded(conv: Converter) -> Converter:
    def convert(raw: bytes) -> Any:
        return conv(raw.decode())

    return convert


_BYTES_FAST: dict[int, Converter] = {
    # int() and float() read ASCII bytes directly; skipping the str saves a copy per value
    OID.INT2: int,
    OID.INT4: int,
    OID.INT8: int,
    OID.FLOAT4: float,
    OID.FLOAT8: float,
    OID.BOOL: {b"t": True, b"f": False}.__getitem__,
    OID.DATE: _date_bytes,
    OID.TIMESTAMP: _timestamp_bytes,
    OID.TIMESTAMPTZ: _timestamp_bytes,
}
_TEXTLIKE = frozenset({OID.TEXT, OID.VARCHAR, OID.BPCHAR, OID.NAME, OID.JSON, OID.JSONB})


def text_converter_for_bytes(type_oid: int) -> Converter:
    """The converter for pgoutput's ``'t'`` column bytes (UTF-8 text) of a type."""
    fast = _BYTES_FAST.get(type_oid)
    if fast is not None:
        return fast
    if type_oid in _TEXTLIKE:
        return bytes.decode
    conv = text_converter(type_oid)
    return bytes.decode if conv is None else _decoded(conv)


def from_text(type_oid: int, text: str) -> Any:
    """Convert one value from its text form; types outside the table come back as ``text``."""
    conv = text_converter(type_oid)
    return text if conv is None else conv(text)


# -- binary form (pgoutput with binary 'true'; the types' send functions) ---------------------

_PG_EPOCH_DATE = dt.date(2000, 1, 1)
_PG_EPOCH = dt.datetime(2000, 1, 1)
_PG_EPOCH_UTC = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
_PG_EPOCH_JDATE = 2451545  # julian day number of 2000-01-01
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_INT32_MAX = 2**31 - 1
_INT32_MIN = -(2**31)

_F4 = struct.Struct("!f").unpack
_F4_PACK = struct.Struct("!f").pack
_F8 = struct.Struct("!d").unpack
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_INTERVAL_BIN = struct.Struct("!qii").unpack
_NUMERIC_HEAD = struct.Struct("!hhHh")
_ARRAY_HEAD = struct.Struct("!iiI")
_ARRAY_DIM = struct.Struct("!ii")

_NUMERIC_POS, _NUMERIC_NEG, _NUMERIC_NAN = 0x0000, 0x4000, 0xC000
_NUMERIC_PINF, _NUMERIC_NINF = 0xD000, 0xF000
_NUMERIC_CONTEXT = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX,
                                   Emin=decimal.MIN_EMIN)  # fmt: skip


def _j2date(jd: int) -> tuple[int, int, int]:
    # julian day -> proleptic Gregorian (year, month, day); year <= 0 means BC (PostgreSQL's
    # j2date), used only for dates datetime cannot hold
    julian = jd + 32044
    quad = julian // 146097
    extra = (julian - quad * 146097) * 4 + 3
    julian += 60 + quad * 3 + extra // 146097
    quad = julian // 1461
    julian -= quad * 1461
    y = julian * 4 // 1461
    julian = (julian + 305) % 365 + 123 if y != 0 else (julian + 306) % 366 + 123
    y += quad * 4
    year = y - 4800
    quad = julian * 2141 // 65536
    day = julian - 7834 * quad // 256
    month = (quad + 10) % 12 + 1
    return year, month, day


def _date_text(days: int) -> str:
    year, month, day = _j2date(days + _PG_EPOCH_JDATE)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} BC"
    return f"{year:04d}-{month:02d}-{day:02d}"


def _bin_date(raw: bytes) -> dt.date | str:
    (days,) = _I32.unpack(raw)
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    try:
        return _PG_EPOCH_DATE + dt.timedelta(days=days)
    except OverflowError:
        return _date_text(days)


def _bin_time(raw: bytes) -> dt.time | str:
    micros = int.from_bytes(raw, "big", signed=True)
    if micros == 86_400_000_000:
        return "24:00:00"
    seconds, micro = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return dt.time(hour, minute, second, micro)


def _timestamp_text(micros: int, utc: bool) -> str:
    days, rest = divmod(micros, 86_400_000_000)
    seconds, micro = divmod(rest, 1_000_000)
    date = _date_text(days)
    clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    if micro:
        clock += f".{micro:06d}".rstrip("0")
    zone = "+00" if utc else ""
    if date.endswith(" BC"):
        return f"{date[:-3]} {clock}{zone} BC"
    return f"{date} {clock}{zone}"


def _bin_timestamp(raw: bytes, epoch: dt.datetime = _PG_EPOCH) -> dt.datetime | str:
    micros = int.from_bytes(raw, "big", signed=True)
    if micros == _INT64_MAX:
        return "infinity"
    if micros == _INT64_MIN:
        return "-infinity"
    try:
        return epoch + dt.timedelta(microseconds=micros)
    except OverflowError:
        return _timestamp_text(micros, epoch.tzinfo is not None)


def _bin_timestamptz(raw: bytes) -> dt.datetime | str:
    return _bin_timestamp(raw, _PG_EPOCH_UTC)


def _bin_interval(raw: bytes) -> Interval:
    micros, days, months = _INTERVAL_BIN(raw)
    return Interval(months, days, micros)


def _bin_numeric(raw: bytes) -> Decimal:
    # numeric_send: ndigits, weight (of the first base-10000 digit), sign, dscale, digits
    ndigits, weight, sign, dscale = _NUMERIC_HEAD.unpack_from(raw)
    if sign == _NUMERIC_NAN:
        return Decimal("NaN")
    if sign == _NUMERIC_PINF:
        return Decimal("Infinity")
    if sign == _NUMERIC_NINF:
        return Decimal("-Infinity")
    if sign not in (_NUMERIC_POS, _NUMERIC_NEG) or len(raw) != 8 + 2 * ndigits:
        raise ValueError("malformed binary numeric")
    digits = struct.unpack_from(f"!{ndigits}h", raw, 8)
    number = 0
    for digit in digits:
        number = number * 10000 + digit
    exponent = (weight - ndigits + 1) * 4
    value = Decimal((1 if sign == _NUMERIC_NEG else 0, tuple(map(int, str(number))), exponent))
    return value.quantize(Decimal((0, (1,), -dscale)), context=_NUMERIC_CONTEXT)


def _bin_inet(raw: bytes) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    family, bits, _is_cidr, size = raw[0], raw[1], raw[2], raw[3]
    address = raw[4 : 4 + size]
    if family not in (2, 3) or len(address) != size or size != (4 if family == 2 else 16):
        raise ValueError("malformed binary inet")
    return ipaddress.ip_interface((address, bits))


def _bin_cidr(raw: bytes) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    interface = _bin_inet(raw)
    return interface.network


def _bin_jsonb(raw: bytes) -> str:
    if raw[:1] != b"\x01":  # jsonb_send writes a format version byte, currently 1
        raise ValueError(f"unknown jsonb binary version {raw[:1]!r}")
    return raw[1:].decode()  # jsonb's text, as jsonb_out prints it


def _bin_float4(raw: bytes) -> float:
    # float4out prints the shortest decimal that reads back as the same float4; do the same so
    # binary and text mode agree (0.1, not 0.10000000149011612)
    (value,) = _F4(raw)
    if value != value or value in (float("inf"), float("-inf")):
        return float(value)
    for digits in range(1, 10):
        shortest = float(f"{value:.{digits}g}")
        try:
            if _F4_PACK(shortest) == raw:
                return shortest
        except OverflowError:  # rounded past the largest float4
            continue
    return float(value)


def _bin_bool(raw: bytes) -> bool:
    if len(raw) != 1:
        raise ValueError("malformed binary bool")
    return raw != b"\x00"


def _bin_int(raw: bytes) -> int:
    if len(raw) not in (2, 4, 8):
        raise ValueError("malformed binary integer")
    return int.from_bytes(raw, "big", signed=True)


_BINARY: dict[int, Converter] = {
    OID.BOOL: _bin_bool,
    OID.BYTEA: bytes,
    OID.NAME: bytes.decode,
    OID.INT8: _bin_int,
    OID.INT2: _bin_int,
    OID.INT4: _bin_int,
    OID.TEXT: bytes.decode,
    OID.JSON: bytes.decode,  # json_send sends the text as stored
    OID.CIDR: _bin_cidr,
    OID.FLOAT4: _bin_float4,
    OID.FLOAT8: lambda raw: _F8(raw)[0],
    OID.INET: _bin_inet,
    OID.BPCHAR: bytes.decode,
    OID.VARCHAR: bytes.decode,
    OID.DATE: _bin_date,
    OID.TIME: _bin_time,
    OID.TIMESTAMP: _bin_timestamp,
    OID.TIMESTAMPTZ: _bin_timestamptz,
    OID.INTERVAL: _bin_interval,
    OID.NUMERIC: _bin_numeric,
    OID.UUID: lambda raw: uuid.UUID(bytes=bytes(raw)),
    OID.JSONB: _bin_jsonb,
}


def _binary_array(element_oid: int) -> Converter:
    element = _BINARY[element_oid]

    def parse(raw: bytes) -> list[Any]:
        # array_send: ndim, has-nulls flag, element type, (length, lower bound) per dimension,
        # then each element as a length (-1 for NULL) and its bytes
        ndim, _flags, elem_oid = _ARRAY_HEAD.unpack_from(raw)
        if elem_oid != element_oid or not 0 <= ndim <= 6:
            raise ValueError("malformed binary array")
        pos = 12
        dims = []
        for _ in range(ndim):
            dims.append(_ARRAY_DIM.unpack_from(raw, pos)[0])
            pos += 8
        flat: list[Any] = []
        count = 1
        for size in dims:
            count *= size
        for _ in range(count if ndim else 0):
            (size,) = _I32.unpack_from(raw, pos)
            pos += 4
            if size == -1:
                flat.append(None)
                continue
            end = pos + size
            if size < 0 or end > len(raw):
                raise ValueError("malformed binary array element")
            flat.append(element(raw[pos:end]))
            pos = end
        if pos != len(raw):
            raise ValueError("trailing bytes in binary array")
        for size in reversed(dims[1:]):
            flat = [flat[i : i + size] for i in range(0, len(flat), size)]
        return flat

    return parse


def binary_converter(type_oid: int) -> Converter | None:
    """The converter for a ``'b'`` column (the type's send format), None when kept as bytes."""
    conv = _BINARY.get(type_oid)
    if conv is not None:
        return conv
    element = ARRAY_ELEMENT.get(type_oid)
    return None if element is None else _binary_array(element)


def from_binary(type_oid: int, raw: bytes) -> Any:
    """Convert one binary-format value; types outside the table come back as ``bytes``."""
    conv = binary_converter(type_oid)
    return bytes(raw) if conv is None else conv(raw)
