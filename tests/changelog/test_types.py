"""PostgreSQL types in the lake: the Arrow type and value each maps to, and every type through
the lake against a live cluster.

One table holds a column of every type docs/types.md lists. Its first rows reach the lake
through a snapshot (COPY text, parsed on Spark's executors), the rest through the drain
(pgoutput), and the merge puts both into ``state/``. The state must then equal the source,
value by value. The expected value of each column is computed by PostgreSQL itself, with an SQL
expression that gives what the type table promises (days since 1970 for a date, the text form
for a range ...). So the test checks the documented mapping, not our own converters.

The database's defaults print values differently from PostgreSQL's defaults (DMY dates,
``sql_standard`` intervals, escaped bytea, a non-UTC zone). The drain and the snapshot must
print them as the decoder reads them anyway.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.types import (
    arrow_schema,
    arrow_type,
    arrow_value,
    numeric_precision_scale,
)
from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.values import OID, Interval, from_text
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import ONE_WINDOW, assert_state_equals_source, drain_in_process, read_delta
from tests.support.snapshot import re_snapshot
from tests.support.sources import Source

UTC = dt.UTC
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))


# -- Arrow ------------------------------------------------------------------------------------


def test_numeric_typmod() -> None:
    assert numeric_precision_scale(-1) is None
    assert numeric_precision_scale((10 << 16 | 2) + 4) == (10, 2)
    assert numeric_precision_scale((5 << 16 | (-3 & 0x7FF)) + 4) == (5, -3)


@pytest.mark.parametrize(
    ("oid", "typmod", "expected"),
    [
        (OID.BOOL, -1, pa.bool_()),
        (OID.INT2, -1, pa.int64()),
        (OID.INT4, -1, pa.int64()),
        (OID.INT8, -1, pa.int64()),
        (OID.FLOAT4, -1, pa.float32()),
        (OID.NUMERIC, (10 << 16 | 2) + 4, pa.decimal128(38, 2)),
        (OID.NUMERIC, (38 << 16 | 2) + 4, pa.decimal128(38, 2)),
        (OID.NUMERIC, (60 << 16 | 5) + 4, pa.string()),
        (OID.NUMERIC, (200 << 16 | 5) + 4, pa.string()),
        (OID.NUMERIC, (5 << 16 | (-3 & 0x7FF)) + 4, pa.string()),
        (OID.NUMERIC, -1, pa.string()),
        (OID.BYTEA, -1, pa.binary()),
        (OID.DATE, -1, pa.date32()),
        (OID.TIME, -1, pa.int64()),
        (OID.TIMESTAMP, -1, pa.timestamp("us")),
        (OID.TIMESTAMPTZ, -1, pa.timestamp("us", tz="UTC")),
        (OID.UUID, -1, pa.string()),
        (OID.JSONB, -1, pa.string()),
        (1007, -1, pa.list_(pa.int64())),
        (None, -1, pa.string()),
    ],
)
def test_arrow_types(oid: int | None, typmod: int, expected: pa.DataType) -> None:
    assert arrow_type(oid, typmod) == expected


def test_interval_is_a_parquet_friendly_struct() -> None:
    assert arrow_type(OID.INTERVAL) == pa.struct(
        [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())]
    )


@pytest.mark.parametrize(
    ("oid", "typmod", "text"),
    [
        (OID.BOOL, -1, "t"),
        (OID.INT4, -1, "7"),
        (OID.FLOAT4, -1, "NaN"),
        (OID.NUMERIC, (10 << 16 | 2) + 4, "12345678.90"),
        (OID.NUMERIC, -1, "NaN"),
        (OID.TEXT, -1, "x"),
        (OID.BYTEA, -1, "\\x01"),
        (OID.DATE, -1, "2024-01-01"),
        (OID.TIME, -1, "12:00:00.5"),
        (OID.TIMESTAMP, -1, "2024-01-01 00:00:00"),
        (OID.TIMESTAMPTZ, -1, "2024-01-01 05:30:00+05:30"),
        (OID.INTERVAL, -1, "1 mon 2 days 00:00:03"),
        (OID.UUID, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        (OID.JSONB, -1, '{"a": 1}'),
        (OID.INET, -1, "10.1.2.3"),
        (OID.CIDR, -1, "10.0.0.0/8"),
        (1009, -1, "{a,NULL}"),
    ],
)
def test_decoded_values_fit_their_arrow_type(oid: int, typmod: int, text: str) -> None:
    data_type = arrow_type(oid, typmod)
    value = arrow_value(from_text(oid, text), oid, typmod)
    array = pa.array([value, None], type=data_type)
    assert array.null_count == 1 and len(array) == 2


def test_arrow_values_read_as_postgresql_prints_them() -> None:
    assert arrow_value(from_text(OID.INET, "10.1.2.3"), OID.INET) == "10.1.2.3"
    assert arrow_value(from_text(OID.INET, "10.1.2.3/8"), OID.INET) == "10.1.2.3/8"
    assert arrow_value(from_text(OID.UUID, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"), OID.UUID) == (
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    )
    assert arrow_value(Interval(1, 2, 3), OID.INTERVAL) == {
        "months": 1,
        "days": 2,
        "microseconds": 3,
    }
    stamp = dt.datetime(2024, 1, 1, 5, 30, tzinfo=IST)
    assert arrow_value(stamp, OID.TIMESTAMPTZ) == dt.datetime(2024, 1, 1, tzinfo=UTC)


NUMERIC_10_2 = (10 << 16 | 2) + 4


@pytest.mark.parametrize(
    ("value", "oid", "typmod", "expected"),
    [
        (Decimal("NaN"), OID.NUMERIC, NUMERIC_10_2, None),  # a decimal has no NaN
        (Decimal("NaN"), OID.NUMERIC, -1, "NaN"),
        (Decimal("-Infinity"), OID.NUMERIC, -1, "-Infinity"),
        ("infinity", OID.DATE, -1, 2**31 - 1),
        ("-infinity", OID.DATE, -1, -(2**31)),
        ("0044-03-15 BC", OID.DATE, -1, -735_160),
        ("10000-01-01", OID.DATE, -1, 2_932_897),
        ("infinity", OID.TIMESTAMP, -1, 2**63 - 1),
        ("-infinity", OID.TIMESTAMPTZ, -1, -(2**63)),
        ("0001-01-01 00:00:00 BC", OID.TIMESTAMP, -1, -62_167_219_200_000_000),
        ("0001-01-01 00:00:00+00 BC", OID.TIMESTAMPTZ, -1, -62_167_219_200_000_000),
        ("10000-01-01 00:00:00.5+01:30", OID.TIMESTAMPTZ, -1, 253_402_295_400_500_000),
        ("24:00:00", OID.TIME, -1, 86_400_000_000),
        (dt.time(0, 0, 1, 5), OID.TIME, -1, 1_000_005),
        ([[1, 2], [3, None]], 1007, -1, [1, 2, 3, None]),  # stored flattened
        ('{"a":  1}', OID.JSON, -1, '{"a":  1}'),
    ],
)
def test_values_python_cannot_hold_have_a_lake_value(
    value: Any, oid: int, typmod: int, expected: Any
) -> None:
    assert arrow_value(value, oid, typmod) == expected
    pa.array([arrow_value(value, oid, typmod)], arrow_type(oid, typmod))


@pytest.mark.parametrize(
    ("value", "oid", "typmod"),
    [
        (Decimal("Infinity"), OID.NUMERIC, NUMERIC_10_2),  # PostgreSQL refuses it there
        ("294248-01-01 00:00:00", OID.TIMESTAMP, -1),  # beyond int64 microseconds since 1970
        ("25:00:00", OID.TIME, -1),
    ],
)
def test_values_the_lake_cannot_hold_are_rejected_loudly(value: Any, oid: int, typmod: int) -> None:
    with pytest.raises(ValueError):
        arrow_value(value, oid, typmod)


def test_arrow_schema_of_a_table() -> None:
    table = TableInfo(
        "public",
        "t",
        [
            ColumnInfo("id", OID.INT8, -1, True, OID.INT8),
            ColumnInfo("price", OID.NUMERIC, (10 << 16 | 2) + 4, False, OID.NUMERIC),
            ColumnInfo("mood", 16390, -1, False, None),  # an enum: text
            ColumnInfo("qty", 16400, -1, False, OID.INT4),  # a domain over int4
        ],
    )
    schema = arrow_schema(table)
    assert schema.names == ["id", "price", "mood", "qty"]
    assert schema.types == [pa.int64(), pa.decimal128(38, 2), pa.string(), pa.int64()]
    assert schema.metadata == {b"postgres.relation": b"public.t"}
    assert arrow_schema(table) == schema


EVERY = TableRef("public", "every")


class Col(NamedTuple):
    """One column: its type, the SQL giving its lake value from ``c``, and three values."""

    name: str
    type: str
    expect: str
    values: tuple[str, str, str]


# the type's output function (what COPY and pgoutput print); c::text differs for inet and xml
TEXT = "CASE WHEN c::text IS NOT NULL THEN format('%s', c) END"  # a row of NULLs IS NULL
DAYS = (
    "CASE WHEN c = 'infinity' THEN 2147483647 WHEN c = '-infinity' THEN -2147483648 "
    "ELSE c - DATE '1970-01-01' END"
)
MICROS = (
    "CASE WHEN c = 'infinity' THEN 9223372036854775807 "
    "WHEN c = '-infinity' THEN -9223372036854775808 "
    "ELSE (extract(epoch FROM c) * 1000000)::int8 END"
)


def flat(element: str) -> str:
    """An array's elements in storage order, each as ``element`` gives it from ``c``."""
    return f"CASE WHEN c IS NULL THEN NULL ELSE ARRAY(SELECT {element} FROM unnest(c) AS u(c)) END"


# fmt: off
COLUMNS = [
    Col("b", "boolean", "c", ("true", "false", "true")),
    Col("i2", "smallint", "c::int8", ("-32768", "0", "32767")),
    Col("i4", "integer", "c::int8", ("-2147483648", "1", "2147483647")),
    Col("i8", "bigint", "c", ("-9223372036854775808", "0", "9223372036854775807")),
    Col("f4", "real", "c::float8", ("1.1", "'NaN'", "'-Infinity'")),
    Col("f8", "double precision", "c", ("0.1", "'Infinity'", "-1e-300")),
    Col("n", "numeric(12,3)", "CASE WHEN c = 'NaN' THEN NULL ELSE c END",
        ("123456789.123", "'NaN'", "-0.001")),
    Col("nu", "numeric", TEXT, ("1e-40", "'NaN'", "'-Infinity'")),
    Col("nbig", "numeric(50,10)", TEXT, ("1234567890123456789012345678901234567890.5", "0",
                                         "-1.5")),
    Col("m", "money", TEXT, ("12.34", "-92233720368547758.08", "0")),
    Col("t", "text", "c", ("'plain'", "''", "E'tab\\t,\"quote\" nul\\\\ 日本'")),
    Col("vc", "varchar(5)", "c", ("'abc'", "'ab, c'", "'é'")),
    Col("ch", "char(4)", "c", ("'ab'", "''", "'abcd'")),
    Col("qc", '"char"', TEXT, ("'a'", "'z'", "'0'")),
    Col("nm", "name", TEXT, ("'pg_class'", "'x y'", "'Ω'")),
    Col("by", "bytea", "c", ("'\\x00ff'", "''", "'\\x5c2c22'")),
    Col("bt", "bit(4)", TEXT, ("B'1010'", "B'0000'", "B'1111'")),
    Col("vb", "bit varying(8)", TEXT, ("B'1'", "B''", "B'10101010'")),
    Col("d", "date", DAYS, ("'2024-02-29'", "'infinity'", "'0044-03-15 BC'")),
    Col("d2", "date", DAYS, ("'1582-10-04'", "'-infinity'", "'10000-01-01'")),
    Col("tm", "time", "(extract(epoch FROM c) * 1000000)::int8",
        ("'12:34:56.789'", "'24:00:00'", "'00:00:00'")),
    Col("ttz", "timetz", TEXT, ("'12:34:56+05:30'", "'00:00:00-12'", "'23:59:59.999999+00'")),
    Col("ts", "timestamp", MICROS, ("'2024-01-01 10:00:00.123456'", "'infinity'",
                                    "'0001-01-01 00:00:00 BC'")),
    Col("tz", "timestamptz", MICROS, ("'2024-06-01 10:00:00+02'", "'-infinity'",
                                      "'12021-01-01 00:00:00+00'")),
    Col("iv", "interval", "CASE WHEN c IS NOT NULL THEN ARRAY[extract(year FROM c) * 12 "
        "+ extract(month FROM c), extract(day FROM c), "
        "extract(epoch FROM c - date_trunc('day', c)) * 1000000]::int8[] END",
        ("'1 year 2 mons -3 days 04:05:06.789'", "'-1 days +02:03:00'", "'-178000000 years'")),
    Col("u", "uuid", TEXT, ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
                            "'00000000-0000-0000-0000-000000000000'",
                            "'ffffffff-ffff-ffff-ffff-ffffffffffff'")),
    Col("j", "json", TEXT, ("'{\"a\": [1, 2.50],  \"a\": 1e400}'", "'null'", "'\"日本\"'")),
    Col("jb", "jsonb", TEXT, ("'{\"b\": 1, \"a\": [1.10, null]}'", "'[]'", "'1e400'")),
    Col("x", "xml", TEXT, ("'<a b=\"1\">t</a>'", "''", "'<?xml version=\"1.0\"?><r/>'")),
    Col("ip", "inet", TEXT, ("'192.168.1.5/24'", "'::1'", "'10.0.0.1'")),
    Col("cidr", "cidr", TEXT, ("'10.0.0.0/8'", "'2001:db8::/32'", "'1.2.3.4/32'")),
    Col("mac", "macaddr", TEXT, ("'08:00:2b:01:02:03'", "'00:00:00:00:00:00'",
                                 "'ff:ff:ff:ff:ff:ff'")),
    Col("mac8", "macaddr8", TEXT, ("'08:00:2b:01:02:03:04:05'", "'00:00:00:00:00:00:00:00'",
                                   "'ff:ff:ff:ff:ff:ff:ff:ff'")),
    Col("tv", "tsvector", TEXT, ("'a fat cat:3'", "''", "'''it''''s'':1A'")),
    Col("tq", "tsquery", TEXT, ("'fat & (rat | cat)'", "''", "'!a'")),
    Col("pt", "point", TEXT, ("'(1,2)'", "'(-1.5,0)'", "'(1e300,NaN)'")),
    Col("ln", "line", TEXT, ("'{1,-1,0}'", "'{0,1,2}'", "'{1,0,-3}'")),
    Col("ls", "lseg", TEXT, ("'[(0,0),(1,1)]'", "'[(1,2),(3,4)]'", "'[(0,0),(0,0)]'")),
    Col("bx", "box", TEXT, ("'(1,1),(0,0)'", "'(2,3),(-1,-1)'", "'(0,0),(0,0)'")),
    Col("pa", "path", TEXT, ("'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'", "'[(0,0)]'")),
    Col("pg", "polygon", TEXT, ("'((0,0),(1,1),(1,0))'", "'((0,0))'", "'((1,2),(3,4),(5,6))'")),
    Col("ci", "circle", TEXT, ("'<(0,0),1>'", "'<(1.5,-2),0>'", "'<(0,0),1e10>'")),
    Col("r4", "int4range", TEXT, ("'[1,10)'", "'empty'", "'(,5]'")),
    Col("rn", "numrange", TEXT, ("'[1.5,2.5]'", "'(,)'", "'[0,0]'")),
    Col("rts", "tsrange", TEXT, ("'[2024-01-01 10:00,2024-01-02)'", "'empty'",
                                 "'[-infinity,infinity)'")),
    Col("rtz", "tstzrange", TEXT, ("'[2024-01-01 10:00+02,)'", "'empty'", "'(,2024-01-01)'")),
    Col("rd", "daterange", TEXT, ("'[2024-01-01,2024-02-01)'", "'empty'", "'[2024-01-01,)'")),
    Col("mr", "int4multirange", TEXT, ("'{[1,3),[5,7)}'", "'{}'", "'{[1,2)}'")),
    Col("mood", "mood", TEXT, ("'happy'", "'sad'", "'it''s, \"odd\"'")),
    Col("pos", "positive", "c::int8", ("1", "2147483647", "42")),
    Col("label", "label", "c", ("'x'", "''", "'y z'")),
    Col("comp", "pair", TEXT, ("ROW(1, 'a b')", "ROW(NULL, '')", "ROW(-1, ',\"')")),
    # a composite of NULL fields IS NULL, yet is a value: '(,)'
    Col("comp0", "pair", TEXT, ("ROW(NULL, NULL)", "ROW(0, NULL)", "ROW(NULL, 'x')")),
    Col("ai", "integer[]", flat("c::int8"), ("'{1,NULL,3}'", "'{}'", "'{{1,2},{3,4}}'")),
    Col("at", "text[]", flat("c"), ("'{a,\"b c\",NULL,\"NULL\"}'", "'{\"\"}'",
                                    "'[0:1]={x,\"{y}\"}'")),
    Col("an", "numeric(6,2)[]", flat("CASE WHEN c = 'NaN' THEN NULL ELSE c END"),
        ("'{1.5,NaN}'", "'{}'", "'{-9999.99}'")),
    Col("ad", "date[]", flat(DAYS), ("'{2024-01-01,infinity}'", "'{\"0044-03-15 BC\"}'", "'{}'")),
    Col("atz", "timestamptz[]", flat(MICROS), ("'{\"2024-01-01 00:00+05\",-infinity}'", "'{}'",
                                                "'{\"0001-01-01 00:00:00+00 BC\"}'")),
    Col("au", "uuid[]", flat("c::text"), ("'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}'", "'{}'",
                                          "NULL")),
    Col("ajb", "jsonb[]", flat("c::text"), ("ARRAY['{\"a\": 1}'::jsonb, 'null']", "'{}'",
                                            "ARRAY['[1, 2]'::jsonb]")),
    Col("ab", "boolean[]", flat("c"), ("'{t,f,NULL}'", "'{}'", "'{{t},{f}}'")),
    Col("af", "double precision[]", flat("c"), ("'{1.5,NaN,-Infinity}'", "'{}'", "'{0}'")),
    Col("amood", "mood[]", TEXT, ("'{happy,sad}'", "'{}'", "ARRAY['it''s, \"odd\"'::mood]")),
    Col("apt", "point[]", TEXT, ("'{\"(1,2)\"}'", "'{}'", "NULL")),
]
# fmt: on

USER_TYPES = [
    "CREATE TYPE mood AS ENUM ('happy', 'sad', 'it''s, \"odd\"')",
    "CREATE DOMAIN positive AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN label AS text",
    "CREATE TYPE pair AS (n integer, s text)",
]

# Printed differently from PostgreSQL's defaults: the lake's sessions must not care.
DATABASE_DEFAULTS = {
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "sql_standard",
    "TimeZone": "Asia/Kolkata",
    "bytea_output": "escape",
    "extra_float_digits": "-3",
}


def columns_of(src: Source) -> list[Col]:
    """Every column, with hstore when the server has the extension, and xml only when the
    server was built with libxml (PyPI's PostgreSQL 18 build is not: xml input fails there)."""
    columns = list(COLUMNS)
    if not _has_libxml(src):
        columns = [c for c in columns if c.type != "xml"]
    if src.sql("SELECT 1 FROM pg_available_extensions WHERE name = 'hstore'"):
        src.sql("CREATE EXTENSION hstore")
        columns.append(Col("hs", "hstore", TEXT, ("'a=>1, \"b c\"=>NULL'", "''",
                                                  "'\"=>\"=>\",\"'")))  # fmt: skip
    return columns


def _has_libxml(src: Source) -> bool:
    import psycopg

    try:
        src.sql("SELECT '<a/>'::xml")
    except psycopg.errors.FeatureNotSupported:
        return False
    return True


def insert_rows(src: Source, columns: list[Col], ids: tuple[int, ...]) -> None:
    names = ", ".join(c.name for c in columns)
    for row_id, which in zip(ids, (0, 1, None, 2), strict=True):
        if which is None:  # every column NULL
            src.sql(f"INSERT INTO every (id) VALUES ({row_id})")
            continue
        values = ", ".join(f"({c.values[which]})::{c.type}" for c in columns)
        src.sql(f"INSERT INTO every (id, {names}) VALUES ({row_id}, {values})")


def expected(src: Source, columns: list[Col]) -> dict[int, dict[str, Any]]:
    """What the lake must hold, row by row, computed by PostgreSQL from the source rows."""
    select = ", ".join(
        f"(SELECT {c.expect} FROM (SELECT every.{c.name} AS c) AS v) AS {c.name}" for c in columns
    )
    with src.cluster.connect(src.db) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("SET DateStyle = 'ISO, MDY'")
        conn.execute("SET IntervalStyle = 'postgres'")
        conn.execute("SET extra_float_digits = 1")
        rows = conn.execute(f"SELECT id, {select} FROM every ORDER BY id").fetchall()
    names = ["id", *(c.name for c in columns)]
    return {row[0]: dict(zip(names, row, strict=True)) for row in rows}


def lake_state(lake_root: str, columns: list[Col]) -> dict[int, dict[str, Any]]:
    """The state as plain values: dates and timestamps as the integers Delta stores."""
    import pyarrow as pa

    table = read_delta(Path(lake_root, "state", "public.every"))
    fields = []
    for field in table.schema:
        kind = field.type.value_type if pa.types.is_list(field.type) else field.type
        as_int = {"date32[day]": pa.int32()}.get(str(kind))
        if pa.types.is_timestamp(kind):
            as_int = pa.int64()
        if as_int is not None:
            kind = pa.list_(as_int) if pa.types.is_list(field.type) else as_int
            field = field.with_type(kind)
        fields.append(field)
    rows = table.cast(pa.schema(fields)).to_pylist()
    for row in rows:  # the interval struct, as [months, days, microseconds]
        if row["iv"] is not None:
            row["iv"] = [row["iv"]["months"], row["iv"]["days"], row["iv"]["microseconds"]]
    return {row["id"]: {c: row[c] for c in ["id", *(c.name for c in columns)]} for row in rows}


def same(lake: Any, source: Any) -> bool:
    if isinstance(lake, float) and isinstance(source, float) and math.isnan(lake):
        return math.isnan(source)
    if isinstance(lake, list) and isinstance(source, list):
        return len(lake) == len(source) and all(map(same, lake, source))
    if isinstance(lake, Decimal) and isinstance(source, Decimal):
        return lake == source
    if isinstance(source, memoryview):
        return lake == bytes(source)
    return bool(lake == source) and type(lake) is type(source)


def assert_lake_equals_source(src: Source, lake_root: str, columns: list[Col]) -> None:
    want, got = expected(src, columns), lake_state(lake_root, columns)
    assert sorted(got) == sorted(want)
    wrong = [
        (row_id, name, got[row_id][name], value)
        for row_id, row in want.items()
        for name, value in row.items()
        if not same(got[row_id][name], value)
    ]
    assert not wrong, wrong


@pytest.mark.pgversion
@pytest.mark.usefixtures("spark")
def test_every_type_through_snapshot_drain_and_merge_equals_the_source(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    lake_root = str(tmp_path / "lake")
    for name, value in DATABASE_DEFAULTS.items():
        source.sql(f'ALTER DATABASE "{source.db}" SET "{name}" = \'{value}\'')
    for statement in USER_TYPES:
        source.sql(statement)
    columns = columns_of(source)
    ddl = ", ".join(f"{c.name} {c.type}" for c in columns)
    source.sql(f"CREATE TABLE every (id int PRIMARY KEY, {ddl})")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE every")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)  # the lake starts empty

    # Through the snapshot: COPY text, parsed on the executors.
    insert_rows(source, columns, (1, 2, 3, 4))
    re_snapshot(spark, source, lake_root, [EVERY])
    assert_lake_equals_source(source, lake_root, columns)

    # Through the drain: the same values decoded from pgoutput, inserted, updated and deleted.
    insert_rows(source, columns, (11, 12, 13, 14))
    names = ", ".join(c.name for c in columns)
    source.sql(f"UPDATE every SET ({names}) = (SELECT {names} FROM every WHERE id = 2) "
               "WHERE id IN (1, 13)")  # fmt: skip
    source.sql(f"UPDATE every SET ({names}) = (SELECT {names} FROM every WHERE id = 3) "
               "WHERE id = 14")  # fmt: skip
    source.sql("DELETE FROM every WHERE id = 4")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_lake_equals_source(source, lake_root, columns)


@pytest.mark.usefixtures("spark")
def test_every_type_in_a_first_state_written_without_a_jvm_then_merged_by_spark(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """A lake begun by a drain (no snapshot): its first state is an Arrow append through
    delta-rs (``merge.arrow``), then Spark merges a key change into that table."""
    lake_root = str(tmp_path / "lake")
    for name, value in DATABASE_DEFAULTS.items():
        source.sql(f'ALTER DATABASE "{source.db}" SET "{name}" = \'{value}\'')
    for statement in USER_TYPES:
        source.sql(statement)
    columns = columns_of(source)
    ddl = ", ".join(f"{c.name} {c.type}" for c in columns)
    source.sql(f"CREATE TABLE every (id int PRIMARY KEY, {ddl})")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE every")
    insert_rows(source, columns, (1, 2, 3, 4))
    names = ", ".join(c.name for c in columns)
    source.sql(f"UPDATE every SET ({names}) = (SELECT {names} FROM every WHERE id = 2) "
               "WHERE id = 1")  # fmt: skip
    source.sql("DELETE FROM every WHERE id = 4")
    first = drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert first["materialized"] == {"public.every": first["window_end_lsn"]}
    assert_lake_equals_source(source, lake_root, columns)

    source.sql("UPDATE every SET id = id + 100 WHERE id IN (2, 3)")  # key changes: Spark's
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_lake_equals_source(source, lake_root, columns)


def test_a_value_the_lake_cannot_hold_quarantines_its_table_and_the_fix_it_names_works(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    from airflow_pglogrepl.lake.lake import Lake

    lake_root = str(tmp_path / "lake")
    source.sql("CREATE TABLE t (id int PRIMARY KEY, ts timestamp)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t VALUES (1, '2024-01-01')")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)

    # In PostgreSQL's range, past a 64-bit count of microseconds since 1970: the table goes to
    # the lake's quarantine (tests/spark/test_quarantine.py), the slot moves on
    source.sql("INSERT INTO t VALUES (2, '294250-01-01 00:00:00')")
    held = drain_in_process(spark, source, lake_root, window=ONE_WINDOW)["quarantined"]["public.t"]
    assert held["error"] == "UnstorableValueError"
    assert held["what"].startswith(
        "column 'ts': the value '294250-01-01 00:00:00' cannot be stored in the lake"
    )
    position = Lake(lake_root, source.slot).position()
    assert source.hook().get_slot(source.slot).confirmed_flush_lsn == position

    source.sql("UPDATE t SET ts = '2025-01-01' WHERE id = 2")
    re_snapshot(spark, source, lake_root, [TableRef("public", "t")])
    source.sql("INSERT INTO t VALUES (3, '2026-01-01')")
    drain_in_process(spark, source, lake_root, window=ONE_WINDOW)
    assert_state_equals_source(source, lake_root, TableRef("public", "t"))
