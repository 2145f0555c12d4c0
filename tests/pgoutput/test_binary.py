"""Column values: PostgreSQL's binary (send) forms to Python, as pgoutput sends them with
``binary 'true'``; the same values as the text forms give wherever both exist."""

from __future__ import annotations

import datetime as dt
import ipaddress
import struct
import uuid
from decimal import Decimal
from typing import Any

import pytest

from airflow_pglogrepl.pgoutput.binary import binary_converter, from_binary
from airflow_pglogrepl.pgoutput.oids import OID, Interval
from airflow_pglogrepl.pgoutput.values import from_text

UTC = dt.UTC


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


def test_types_without_a_binary_converter_stay_raw() -> None:
    assert binary_converter(142) is None  # xml
    assert binary_converter(OID.INT4) is not None
    assert binary_converter(1007) is not None  # int4[]: an array of a converted element


@pytest.mark.parametrize(
    ("oid", "text", "raw"),
    [
        (OID.INT4, "-7", struct.pack("!i", -7)),
        (OID.DATE, "2024-02-29", struct.pack("!i", 8825)),
        (OID.TIMESTAMPTZ, "2000-01-01 00:00:01+00", struct.pack("!q", 1_000_000)),
        (OID.INTERVAL, "1 mon 2 days 00:00:03", struct.pack("!qii", 3_000_000, 2, 1)),
    ],
)
def test_binary_and_text_forms_give_the_same_value(oid: int, text: str, raw: bytes) -> None:
    assert from_binary(oid, raw) == from_text(oid, text)
