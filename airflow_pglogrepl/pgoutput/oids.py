"""PostgreSQL's built-in types as the decoder knows them: their OIDs, the element type of each
array type, and the names the catalog (``typname``) and ``format_type`` give them; with
``Converter`` (what every value converter is) and ``Interval`` (an ``interval`` value).

The tables are fixed across PostgreSQL versions (the live tests check them against the catalog).
``values`` (text forms) and ``binary`` (send forms) convert by these OIDs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["ARRAY_ELEMENT", "FORMAT_TYPE_NAMES", "OID", "TYPNAME_OIDS", "Converter", "Interval"]

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
