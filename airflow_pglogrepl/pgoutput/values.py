"""Column values: PostgreSQL's text forms to Python, by type OID (the binary forms are
``binary``'s, the type tables ``oids``'; both are exported here too).

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
import ipaddress
import re
import uuid
from decimal import Decimal
from typing import Any

from airflow_pglogrepl.pgoutput.binary import binary_converter, from_binary
from airflow_pglogrepl.pgoutput.oids import (
    ARRAY_ELEMENT,
    FORMAT_TYPE_NAMES,
    OID,
    TYPNAME_OIDS,
    Converter,
    Interval,
)

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
