"""The built-in type tables: OIDs, array elements, and the names the catalog and
``format_type`` give each type."""

from __future__ import annotations

from airflow_pglogrepl.pgoutput.oids import (
    ARRAY_ELEMENT,
    FORMAT_TYPE_NAMES,
    OID,
    TYPNAME_OIDS,
    Interval,
)


def test_type_tables_agree() -> None:
    assert FORMAT_TYPE_NAMES["integer[]"] == 1007
    assert FORMAT_TYPE_NAMES["timestamp with time zone"] == OID.TIMESTAMPTZ
    assert TYPNAME_OIDS["_int4"] == 1007
    assert TYPNAME_OIDS["int4"] == OID.INT4
    assert set(ARRAY_ELEMENT.values()) == {
        v for k, v in TYPNAME_OIDS.items() if not k.startswith("_")
    }


def test_every_array_type_names_its_element_with_brackets() -> None:
    for array, element in ARRAY_ELEMENT.items():
        names = [n for n, oid in FORMAT_TYPE_NAMES.items() if oid == element]
        assert names, element
        assert all(FORMAT_TYPE_NAMES[f"{n}[]"] == array for n in names), array


def test_an_interval_keeps_its_three_fields_apart() -> None:
    value = Interval(1, 2, 3)
    assert (value.months, value.days, value.microseconds) == (1, 2, 3)
    assert value != Interval(0, 32, 3)
    assert OID.INTERVAL == 1186
