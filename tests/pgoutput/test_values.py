"""Column values: PostgreSQL's text forms to Python, and the value type of a column."""

from __future__ import annotations

import datetime as dt
import ipaddress
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest

from airflow_pglogrepl.pgoutput import binary, oids, values
from airflow_pglogrepl.pgoutput.oids import OID, Interval
from airflow_pglogrepl.pgoutput.values import from_text, text_converter_for_bytes, value_type

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


def test_the_type_tables_and_binary_converters_are_still_exported_here() -> None:
    moved = {"ARRAY_ELEMENT", "FORMAT_TYPE_NAMES", "OID", "TYPNAME_OIDS", "Interval"}
    assert moved <= set(values.__all__)
    for name in moved:
        assert getattr(values, name) is getattr(oids, name), name
    assert values.binary_converter is binary.binary_converter
    assert values.from_binary is binary.from_binary
