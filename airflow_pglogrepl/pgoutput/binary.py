"""Column values in PostgreSQL's binary (send) forms to Python, by type OID.

pgoutput sends these (``'b'`` columns) when the slot is read with ``binary 'true'``: each type's
send function's output, parsed here to the same values ``values`` gives for the text form.
Values Python's types cannot hold come back as PostgreSQL's text form, as there.
See https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html (TupleData)
"""

from __future__ import annotations

import datetime as dt
import decimal
import ipaddress
import struct
import uuid
from decimal import Decimal
from typing import Any

from airflow_pglogrepl.pgoutput.oids import ARRAY_ELEMENT, OID, Converter, Interval

__all__ = ["binary_converter", "from_binary"]


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
