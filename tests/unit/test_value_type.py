"""One rule for the type a column's values are converted as, shared by the drain's decoder and
the snapshot's copy (a domain over a built-in type converts as its base type)."""

from __future__ import annotations

from airflow_pglogrepl.pgoutput.values import OID, value_type


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
