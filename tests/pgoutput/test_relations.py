"""The relation cache: Relation and Type messages in, the table a data message names out."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import DecodeError, UnknownRelationError
from airflow_pglogrepl.pgoutput.messages import TypeMessage
from airflow_pglogrepl.pgoutput.oids import OID
from airflow_pglogrepl.pgoutput.relations import RelationCache
from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from tests.support.pgoutput_encoder import encode, relation, u32

DOMAIN = 16500  # past the built-in OIDs: pgoutput sends a Type message for it


def test_a_relation_becomes_current_only_when_described() -> None:
    cache = RelationCache()
    table = cache.relation(relation(7, "t", [("id", OID.INT4, True), ("v", OID.TEXT)]))
    assert (table.schema, table.table, table.relation_id, table.replica_identity) == (
        "public",
        "t",
        7,
        "d",
    )
    assert table.columns == (
        ColumnInfo("id", OID.INT4, -1, True, OID.INT4, None),
        ColumnInfo("v", OID.TEXT, -1, False, OID.TEXT, None),
    )
    assert cache.tables == {}
    cache.describe(table)
    assert cache.tables == {7: table}
    assert cache.fast_tables == {u32(7) + b"N": table}


def test_a_domain_converts_as_the_base_type_its_type_message_names() -> None:
    cache = RelationCache()
    plain = cache.relation(relation(7, "t", [("d", DOMAIN)]))
    assert (plain.columns[0].value_type_oid, plain.columns[0].type_name) == (None, None)
    cache.add_type(TypeMessage(None, DOMAIN, "pg_catalog", "numeric"))
    typed = cache.relation(relation(7, "t", [("d", DOMAIN)]))
    assert (typed.columns[0].value_type_oid, typed.columns[0].type_name) == (
        OID.NUMERIC,
        "pg_catalog.numeric",
    )


def test_a_data_message_finds_its_table_in_the_open_stream_first() -> None:
    cache = RelationCache()
    cached = cache.relation(relation(7, "t", [("id", OID.INT4)]))
    cache.describe(cached)
    streamed = cache.relation(relation(7, "t", [("id", OID.INT4), ("new", OID.TEXT)]))
    assert cache.table(7, "I") is cached
    assert cache.table(7, "I", {7: streamed}) is streamed
    assert cache.table(7, "I", {8: streamed}) is cached


@pytest.mark.parametrize(("overlay", "offset"), [(None, 1), ({}, 5)])
def test_an_unknown_relation_names_its_oid_and_offset(
    overlay: dict[int, TableInfo] | None, offset: int
) -> None:
    with pytest.raises(UnknownRelationError) as info:
        RelationCache().table(9, "D", overlay)
    assert (info.value.relation_id, info.value.message_type, info.value.offset) == (9, "D", offset)


def test_a_re_described_table_replaces_the_old_in_the_same_dicts() -> None:
    cache = RelationCache()
    tables, fast = cache.tables, cache.fast_tables
    cache.feed(encode(relation(7, "t", [("a", OID.INT4)])))
    cache.feed(encode(relation(7, "t", [("a", OID.INT4), ("b", OID.INT8)])))
    assert cache.tables is tables and cache.fast_tables is fast
    assert tables[7].names == ("a", "b")
    assert fast[u32(7) + b"N"] is tables[7]


def test_feed_takes_relation_and_type_messages_only() -> None:
    cache = RelationCache(proto_version=2)
    cache.feed(encode(TypeMessage(None, DOMAIN, "pg_catalog", "int8")))
    cache.feed(encode(relation(7, "t", [("d", DOMAIN)])))
    assert cache.tables[7].columns[0].value_type_oid == OID.INT8
    with pytest.raises(DecodeError, match="not a Relation or Type message"):
        cache.feed(b"E")  # Stream Stop
    with pytest.raises(DecodeError, match="needs proto_version 2"):
        RelationCache().feed(b"E")


def test_protocol_versions_outside_1_to_4_are_refused() -> None:
    with pytest.raises(ValueError, match="proto_version 5 is not supported"):
        RelationCache(proto_version=5)
