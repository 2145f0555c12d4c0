"""The changelog's column contract: the metadata columns after a table's own, in one order and
type, and the table's key and replica identity recorded in the schema's field metadata, where
the merge reads them back."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog import columns as cl

pytestmark = pytest.mark.unit

BASE = [
    pa.field("a", pa.int64()),
    pa.field("b", pa.string()).with_metadata({"kept": "yes"}),
    pa.field("c", pa.float64()),
]


def test_key_columns_are_marked_by_their_place_in_the_key_and_keep_their_metadata() -> None:
    marked = cl.mark_keys(BASE, ["c", "b"])
    assert [f.name for f in marked] == ["a", "b", "c"]
    assert marked[0] is BASE[0]  # not a key column: untouched
    assert marked[1].metadata == {b"kept": b"yes", cl.KEY_META.encode(): b"1"}
    assert marked[2].metadata == {cl.KEY_META.encode(): b"0"}
    assert cl.mark_keys(pa.schema(BASE), []) == BASE


def test_the_metadata_columns_follow_in_the_contracts_order_and_types() -> None:
    fields = cl.meta_fields(BASE, "f")
    assert tuple(f.name for f in fields) == cl.META_COLUMNS
    assert [str(f.type) for f in fields[:-1]] == [
        "string", "int64", "int64", "int64", "timestamp[us, tz=UTC]", "list<item: string>"
    ]  # fmt: skip
    assert all(f.nullable for f in fields)  # Delta on Spark reads NOT NULL as an invariant
    assert fields[0].metadata == {cl.IDENTITY_META.encode(): b"f"}
    assert fields[-1].type == pa.struct([pa.field(f.name, f.type) for f in BASE])
    assert all(not f.metadata for f in fields[-1].type)  # the old row's fields carry no marks
    assert cl.meta_fields(BASE)[0].metadata == {cl.IDENTITY_META.encode(): b"d"}


def test_the_key_and_the_identity_read_back_from_the_schema() -> None:
    schema = pa.schema([*cl.mark_keys(BASE, ["c", "a"]), *cl.meta_fields(BASE, "i")])
    pairs = [
        (f.name, {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}) for f in schema
    ]
    assert cl.described_key(pairs) == ["c", "a"]
    assert cl.described_identity(pairs) == "i"
    assert cl.described_key([("a", None)]) == []
    assert cl.described_identity([("a", None), (cl.OP, None)]) == "d"  # nothing recorded


def test_a_tables_changelog_schema_is_its_typed_columns_key_marked_then_the_metadata() -> None:
    from airflow_pglogrepl.changelog.types import arrow_schema
    from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
    from airflow_pglogrepl.pgoutput.values import OID

    table = TableInfo("public", "t", [ColumnInfo("id", OID.INT8, -1, True, OID.INT8),
                                      ColumnInfo(cl.OLD, OID.TEXT, -1, False, OID.TEXT)],
                      replica_identity="f")  # fmt: skip
    schema = cl.changelog_schema(table)
    base = arrow_schema(table)
    want = pa.schema([*cl.mark_keys(base, ["id"]), *cl.meta_fields(base, "f")])
    assert schema.equals(want, check_metadata=True)
    assert schema.names == ["id", cl.OLD, *cl.META_COLUMNS]
    # a table column called _old too: the changelog's own is the last
    assert cl.old_type(schema) == pa.struct([pa.field("id", pa.int64()), (cl.OLD, pa.string())])
    with pytest.raises(AssertionError):
        cl.old_type(pa.schema([base.field("id")]))  # no changelog schema
