"""Column values: PostgreSQL text and binary forms to Python."""

from __future__ import annotations

import datetime as dt
import ipaddress
import math
import struct
import uuid
from decimal import Decimal
from typing import Any

import pytest

from airflow_pglogrepl.pgoutput.values import (
    ARRAY_ELEMENT,
    FORMAT_TYPE_NAMES,
    OID,
    TYPNAME_OIDS,
    Interval,
    from_binary,
    from_text,
    text_converter_for_bytes,
    value_type,
)

UTC = dt.UTC
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))


@pytest.mark.parametrize(
    ("oid", "text", "expected"),
    [
        (OID.BOOL, "t", True),
        (OID.BOOL, "f", False),
        (OID.BOOL, "true", True),  # test_decoding spells booleans out
        (OID.INT2, "-32768", -32768),
        (OID.INT4, "2147483647", 2147483647),
        (OID.INT8, "-9223372036854775808", -9223372036854775808),
        (OID.FLOAT4, "1.5", 1.5),
        (OID.FLOAT8, "-1.25e-300", -1.25e-300),
        (OID.FLOAT8, "Infinity", math.inf),
        (OID.FLOAT8, "-Infinity", -math.inf),
        (OID.NUMERIC, "12345678901234567890.000000000000000001",
         Decimal("12345678901234567890.000000000000000001")),
        (OID.NUMERIC, "Infinity", Decimal("Infinity")),
        (OID.NUMERIC, "-Infinity", Decimal("-Infinity")),
        (OID.TEXT, "it's \u00e9", "it's \u00e9"),
        (OID.VARCHAR, "v", "v"),
        (OID.BPCHAR, "ab   ", "ab   "),
        (OID.NAME, "pg_class", "pg_class"),
        (OID.BYTEA, "\\x00ff10", b"\x00\xff\x10"),
        (OID.BYTEA, "\\x", b""),
        (OID.BYTEA, "a\\\\b\\000\\377", b"a\\b\x00\xff"),  # bytea_output = 'escape'
        (OID.DATE, "2024-02-29", dt.date(2024, 2, 29)),
        (OID.DATE, "infinity", "infinity"),
        (OID.DATE, "-infinity", "-infinity"),
        (OID.DATE, "0044-03-15 BC", "0044-03-15 BC"),
        (OID.DATE, "10000-01-01", "10000-01-01"),
        (OID.TIME, "23:59:59.999999", dt.time(23, 59, 59, 999999)),
        (OID.TIME, "24:00:00", "24:00:00"),
        (OID.TIMESTAMP, "2024-01-02 03:04:05", dt.datetime(2024, 1, 2, 3, 4, 5)),
        (OID.TIMESTAMP, "2024-01-02 03:04:05.5", dt.datetime(2024, 1, 2, 3, 4, 5, 500000)),
        (OID.TIMESTAMP, "infinity", "infinity"),
        (OID.TIMESTAMP, "2024-01-02 03:04:05 BC", "2024-01-02 03:04:05 BC"),
        (OID.TIMESTAMPTZ, "2024-01-02 03:04:05.123456+00",
         dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        (OID.TIMESTAMPTZ, "2024-01-02 08:34:05+05:30",
         dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (OID.TIMESTAMPTZ, "-infinity", "-infinity"),
        (OID.INTERVAL, "00:00:00", Interval(0, 0, 0)),
        (OID.INTERVAL, "1 year 2 mons 3 days 04:05:06.789",
         Interval(14, 3, ((4 * 60 + 5) * 60 + 6) * 1_000_000 + 789_000)),
        (OID.INTERVAL, "-1 years -2 mons +3 days -04:05:06", Interval(-14, 3, -14_706_000_000)),
        (OID.INTERVAL, "1 mon", Interval(1, 0, 0)),
        (OID.INTERVAL, "-1 days +02:03:00", Interval(0, -1, 7_380_000_000)),
        (OID.INTERVAL, "1000000:00:00.000001", Interval(0, 0, 3_600_000_000_000_001)),
        (OID.UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
         uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
        # json and jsonb stay exactly as printed: spacing, duplicate keys, digits
        (OID.JSON, '{"a": [1, 2.50, null],  "a": 1e400}', '{"a": [1, 2.50, null],  "a": 1e400}'),
        (OID.JSONB, '"text"', '"text"'),
        (OID.INET, "192.168.1.5/24", ipaddress.ip_interface("192.168.1.5/24")),
        (OID.INET, "::1", ipaddress.ip_interface("::1/128")),
        (OID.CIDR, "10.0.0.0/8", ipaddress.ip_network("10.0.0.0/8")),
        (1007, "{1,NULL,3}", [1, None, 3]),
        (1007, "{}", []),
        (1007, "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
        (1007, "[0:1]={7,8}", [7, 8]),
        (1009, '{"a b","c\\"d","e\\\\f",NULL,"NULL",x}', ["a b", 'c"d', "e\\f", None, "NULL", "x"]),
        (1009, '{"{",",","}"}', ["{", ",", "}"]),
        (1231, "{1.5,-2}", [Decimal("1.5"), Decimal("-2")]),
        (1182, "{2024-01-01,infinity}", [dt.date(2024, 1, 1), "infinity"]),
        (1000, "{t,f}", [True, False]),
        (3807, '{"{\\"a\\": 1}"}', ['{"a": 1}']),
        (142, "<x/>", "<x/>"),  # xml: not converted, kept as text
    ],
)  # fmt: skip
def test_from_text(oid: int, text: str, expected: Any) -> None:
    value = from_text(oid, text)
    assert value == expected
    assert type(value) is type(expected)


def test_numeric_nan_and_float_nan() -> None:
    assert from_text(OID.NUMERIC, "NaN").is_nan()
    assert math.isnan(from_text(OID.FLOAT8, "NaN"))


def test_numeric_keeps_its_scale() -> None:
    assert str(from_text(OID.NUMERIC, "1.50")) == "1.50"


@pytest.mark.parametrize(
    ("oid", "text"),
    [
        (OID.DATE, "01/02/2024"),  # DateStyle SQL, not ISO
        (OID.TIMESTAMP, "Tue Jan 02 03:04:05 2024"),
        (OID.INTERVAL, "@ 1 year"),  # IntervalStyle postgres_verbose
        (OID.INTERVAL, ""),
        (OID.BOOL, "maybe"),
        (OID.BYTEA, "bad\\escape"),
        (1007, "1,2"),
    ],
)
def test_unreadable_text_raises(oid: int, text: str) -> None:
    with pytest.raises((ValueError, KeyError)):
        from_text(oid, text)


def test_pgoutput_bytes_converters_agree_with_text_ones() -> None:
    samples = {
        OID.BOOL: "t",
        OID.INT4: "-7",
        OID.FLOAT8: "NaN",
        OID.TEXT: "\u00e9t\u00e9",
        OID.NUMERIC: "-0.001",
        OID.TIMESTAMPTZ: "2024-01-02 03:04:05+00",
        OID.JSONB: '{"k": "\u00e9"}',
        1009: '{"\u00e9",b}',
        0: "anything",
    }
    for oid, text in samples.items():
        got = text_converter_for_bytes(oid)(text.encode())
        want = from_text(oid, text)
        assert got == want or (got != got and want != want), oid  # NaN != NaN


# -- binary (send) format ---------------------------------------------------------------------


def _i64(value: int) -> bytes:
    return struct.pack("!q", value)


@pytest.mark.parametrize(
    ("oid", "raw", "expected"),
    [
        (OID.BOOL, b"\x01", True),
        (OID.INT2, b"\xff\xfe", -2),
        (OID.INT4, b"\x00\x00\x01\x00", 256),
        (OID.INT8, _i64(-5), -5),
        (OID.FLOAT4, struct.pack("!f", 1.5), 1.5),
        (OID.FLOAT4, struct.pack("!f", 0.1), 0.1),  # as float4out prints it, like text mode
        (OID.FLOAT4, struct.pack("!f", 3.4028235e38), 3.4028235e38),
        (OID.FLOAT4, struct.pack("!f", float("-inf")), float("-inf")),
        (OID.FLOAT8, struct.pack("!d", -2.25), -2.25),
        (OID.TEXT, "\u00e9".encode(), "\u00e9"),
        (OID.BYTEA, b"\x00\x01", b"\x00\x01"),
        (OID.UUID, bytes(range(16)), uuid.UUID(bytes=bytes(range(16)))),
        (OID.DATE, struct.pack("!i", 1), dt.date(2000, 1, 2)),
        (OID.DATE, struct.pack("!i", 2**31 - 1), "infinity"),
        (OID.DATE, struct.pack("!i", -(2**31)), "-infinity"),
        # day counts from PostgreSQL: date '0044-03-15 BC' - date '2000-01-01' is -746117
        (OID.DATE, struct.pack("!i", -746_117), "0044-03-15 BC"),
        (OID.DATE, struct.pack("!i", 2_921_940), "10000-01-01"),
        (OID.TIMESTAMP, _i64((-746_117 * 86_400 + 43_200) * 1_000_000 + 250_000),
         "0044-03-15 12:00:00.25 BC"),
        (OID.TIMESTAMPTZ, _i64(2_921_940 * 86_400_000_000), "10000-01-01 00:00:00+00"),
        (OID.TIME, _i64(3_723_000_001), dt.time(1, 2, 3, 1)),
        (OID.TIME, _i64(86_400_000_000), "24:00:00"),
        (OID.TIMESTAMP, _i64(1_500_000), dt.datetime(2000, 1, 1, 0, 0, 1, 500000)),
        (OID.TIMESTAMP, _i64(2**63 - 1), "infinity"),
        (OID.TIMESTAMPTZ, _i64(-1), dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        (OID.TIMESTAMPTZ, _i64(-(2**63)), "-infinity"),
        (OID.INTERVAL, struct.pack("!qii", 5, -3, 14), Interval(14, -3, 5)),
        (OID.JSONB, b"\x01[1]", "[1]"),
        (OID.JSON, b'{"a":1}', '{"a":1}'),
        (OID.INET, bytes([2, 24, 0, 4, 192, 168, 1, 5]), ipaddress.ip_interface("192.168.1.5/24")),
        (OID.CIDR, bytes([2, 8, 1, 4, 10, 0, 0, 0]), ipaddress.ip_network("10.0.0.0/8")),
        (142, b"<x/>", b"<x/>"),  # no converter: the raw bytes
    ],
)  # fmt: skip
def test_from_binary(oid: int, raw: bytes, expected: Any) -> None:
    value = from_binary(oid, raw)
    assert value == expected
    assert type(value) is type(expected)


def _numeric(ndigits: int, weight: int, sign: int, dscale: int, *digits: int) -> bytes:
    return struct.pack(f"!hhHh{ndigits}h", ndigits, weight, sign, dscale, *digits)


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (_numeric(2, 0, 0, 2, 1, 5000), "1.50"),
        (_numeric(3, 1, 0x4000, 4, 12, 3456, 7800), "-123456.7800"),
        (_numeric(1, -1, 0, 4, 10), "0.0010"),
        (_numeric(0, 0, 0, 0), "0"),
        (_numeric(0, 0, 0, 3), "0.000"),
        (_numeric(1, 2, 0, 0, 1), "100000000"),
        (_numeric(0, 0, 0xC000, 0), "NaN"),
        (_numeric(0, 0, 0xD000, 0), "Infinity"),
        (_numeric(0, 0, 0xF000, 0), "-Infinity"),
    ],
)
def test_binary_numeric_equals_its_text_form(raw: bytes, text: str) -> None:
    value = from_binary(OID.NUMERIC, raw)
    assert str(value) == str(Decimal(text))


def test_binary_arrays() -> None:
    def element(value: int | None) -> bytes:
        return struct.pack("!i", -1) if value is None else struct.pack("!ii", 4, value)

    flat = struct.pack("!iiI", 1, 1, OID.INT4) + struct.pack("!ii", 3, 1)
    flat += element(1) + element(None) + element(3)
    assert from_binary(1007, flat) == [1, None, 3]
    square = struct.pack("!iiI", 2, 0, OID.INT4) + struct.pack("!iiii", 2, 1, 2, 1)
    square += b"".join(element(v) for v in (1, 2, 3, 4))
    assert from_binary(1007, square) == [[1, 2], [3, 4]]
    assert from_binary(1007, struct.pack("!iiI", 0, 0, OID.INT4)) == []
    with pytest.raises(ValueError, match="malformed"):
        from_binary(1007, struct.pack("!iiI", 1, 0, OID.TEXT) + struct.pack("!ii", 0, 1))
    with pytest.raises(ValueError, match="trailing"):
        from_binary(1007, flat + b"\x00")


# -- type tables ------------------------------------------------------------------------------


def test_type_tables_agree() -> None:
    assert FORMAT_TYPE_NAMES["integer[]"] == 1007
    assert FORMAT_TYPE_NAMES["timestamp with time zone"] == OID.TIMESTAMPTZ
    assert TYPNAME_OIDS["_int4"] == 1007
    assert TYPNAME_OIDS["int4"] == OID.INT4
    assert set(ARRAY_ELEMENT.values()) == {
        v for k, v in TYPNAME_OIDS.items() if not k.startswith("_")
    }


# -- the value type: one rule for the decoder and the snapshot ------------------------------


def test_a_type_with_a_converter_is_its_own_value_type() -> None:
    assert value_type(OID.INT4, None) == OID.INT4
    assert value_type(OID.NUMERIC, ("pg_catalog", "text")) == OID.NUMERIC


def test_a_domain_over_a_built_in_type_converts_as_its_base() -> None:
    assert value_type(16500, ("pg_catalog", "numeric")) == OID.NUMERIC
    assert value_type(16500, ("pg_catalog", "_int4")) == 1007  # int4[]


def test_everything_else_stays_text() -> None:
    assert value_type(16500, None) is None  # no Type message seen
    assert value_type(16500, ("public", "mood")) is None  # an enum, or a domain over one
    assert value_type(16500, ("pg_catalog", "tsvector")) is None  # no converter for its base
    assert value_type(3614, ("pg_catalog", "numeric")) is None  # built-in: never described
