"""The row builder: a table's decoded changes gathered into one typed Arrow table of the
changelog's shape, each change's row where the contract puts it (an insert's and an update's new
row, a delete's old key, nothing for a truncate), the transaction's columns taken per run of
changes, and a value the lake cannot hold refused naming its table and column."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.changelog.rows import ChangelogBatch, assemble, truncate_row
from airflow_pglogrepl.changelog.types import arrow_schema
from airflow_pglogrepl.exceptions import UnstorableValueError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import Change, PgOutputStream
from airflow_pglogrepl.pgoutput.messages import (
    UNCHANGED_TOAST,
    BeginMessage,
    CommitMessage,
    DeleteMessage,
    InsertMessage,
    PgOutputMessage,
    TruncateMessage,
    UpdateMessage,
)
from airflow_pglogrepl.pgoutput.values import OID
from tests.support.pgoutput_encoder import encode, relation

pytestmark = pytest.mark.unit

OPTIONS = {"proto_version": "1", "publication_names": "p", "messages": "false"}
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
NUMERIC_10_2 = (10 << 16 | 2) + 4
COLUMNS = [("id", OID.INT8, True), ("v", OID.TEXT), ("n", OID.NUMERIC, False, NUMERIC_10_2)]


def changes(*bodies: Sequence[PgOutputMessage], identity: str = "d") -> list[Change]:
    """The changes of one transaction per body, on table ``public.t`` (``COLUMNS``)."""
    messages: list[PgOutputMessage] = [relation(1, "t", COLUMNS, identity=identity)]
    for xid, body in enumerate(bodies, 100):
        final = LSN(0x1000 * (xid - 99))
        messages += [BeginMessage(final, T0, xid), *body, CommitMessage(0, final, final, T0)]
    stream = PgOutputStream.from_options(OPTIONS)
    rows = [(LSN(16 + i), None, encode(m)) for i, m in enumerate(messages)]
    return [e for e in stream.decode(rows) if e.__class__ is Change]


def batch_of(found: Sequence[Change]) -> ChangelogBatch:
    batch = ChangelogBatch(found[0].table)
    for change in found:
        batch.add(change, change.seq)
    return batch


def test_the_schema_is_the_tables_typed_columns_key_marked_then_the_metadata_columns() -> None:
    (change,) = changes([InsertMessage(None, 1, ("1", "x", "1.50"))], identity="f")
    schema = ChangelogBatch(change.table).schema()
    base = arrow_schema(change.table)
    assert schema.names == ["id", "v", "n", *cl.META_COLUMNS]
    assert schema.field("n").type == pa.decimal128(38, 2)
    assert schema.field("id").metadata[cl.KEY_META.encode()] == b"0"
    assert schema.field("v").metadata == base.field("v").metadata  # the source type kept
    assert schema.field(cl.OP).metadata == {cl.IDENTITY_META.encode(): b"f"}
    assert schema.field(cl.OLD).type == pa.struct([pa.field(f.name, f.type) for f in base])


def test_each_change_puts_its_row_where_the_contract_says() -> None:
    found = changes(
        [
            InsertMessage(None, 1, ("1", "a", "1.50")),
            UpdateMessage(None, 1, "K", ("1", None, None), ("2", UNCHANGED_TOAST, "2.00")),
        ],
        [
            DeleteMessage(None, 1, "K", ("2", None, None)),
            TruncateMessage(None, 0, (1,)),
        ],
    )
    table = batch_of(found).to_arrow()
    assert table.schema.equals(ChangelogBatch(found[0].table).schema(), check_metadata=True)
    rows: list[dict[str, Any]] = table.to_pylist()
    assert [(r["id"], r["v"], r["n"]) for r in rows] == [
        (1, "a", Decimal("1.50")), (2, None, Decimal("2.00")), (2, None, None), (None, None, None)
    ]  # fmt: skip
    assert [r[cl.OP] for r in rows] == [cl.INSERT, cl.UPDATE, cl.DELETE, cl.TRUNCATE]
    assert [r[cl.UNCHANGED] for r in rows] == [None, ["v"], None, None]
    assert [r[cl.OLD] for r in rows] == [None, {"id": 1, "v": None, "n": None}, None, None]
    assert [r[cl.SEQ] for r in rows] == [c.seq for c in found]
    # the transaction's columns, once per run of its changes
    assert [r[cl.XID] for r in rows] == [100, 100, 101, 101]
    assert [r[cl.COMMIT_LSN] for r in rows] == [0x1000, 0x1000, 0x2000, 0x2000]
    assert [r[cl.COMMIT_TS] for r in rows] == [T0] * 4
    assert len(batch_of(found)) == 4


def test_an_empty_batch_is_an_empty_table_of_the_schema() -> None:
    (change,) = changes([InsertMessage(None, 1, ("1", "a", "1.50"))])
    empty = ChangelogBatch(change.table).to_arrow()
    assert empty.num_rows == 0
    assert empty.schema.equals(ChangelogBatch(change.table).schema(), check_metadata=True)


@pytest.mark.parametrize(
    ("body", "column"),
    [
        ([InsertMessage(None, 1, ("1", "a", "Infinity"))], "n"),
        ([UpdateMessage(None, 1, "O", ("1", "a", "Infinity"), ("1", "a", "1.00"))], "_old.n"),
    ],
)
def test_a_value_the_lake_cannot_hold_is_refused_naming_its_column(
    body: list[PgOutputMessage], column: str
) -> None:
    with pytest.raises(UnstorableValueError) as caught:
        batch_of(changes(body, identity="f")).to_arrow()
    assert (caught.value.table, caught.value.column) == ("public.t", column)
    assert "Infinity" in str(caught.value)


def test_assemble_puts_the_metadata_columns_after_the_tables_in_the_contracts_order() -> None:
    (change,) = changes([InsertMessage(None, 1, ("1", "a", "1.50"))])
    schema = cl.changelog_schema(change.table)
    columns = [pa.array([1, 2], pa.int64()), pa.array(["a", None]),
               pa.array([Decimal("1.50"), None], pa.decimal128(38, 2))]  # fmt: skip
    micros = int((T0 - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) / dt.timedelta(microseconds=1))
    table = assemble(
        schema,
        columns,
        op=pa.array([cl.INSERT, cl.UPDATE]),
        lsn=pa.array([5, 6], pa.int64()),
        seq=pa.array([0, 1], pa.int64()),
        xid=pa.array([7, 7], pa.int64()),
        ts=pa.array([micros, micros], pa.int64()),  # microseconds: cast to the commit time
        unchanged=None,
        old=None,
    )
    assert table.schema.equals(schema, check_metadata=True)
    assert table.to_pylist()[1] == {
        "id": 2, "v": None, "n": None, cl.OP: cl.UPDATE, cl.COMMIT_LSN: 6, cl.SEQ: 1,
        cl.XID: 7, cl.COMMIT_TS: T0, cl.UNCHANGED: None, cl.OLD: None,
    }  # fmt: skip
    meta = {name: table[name].chunk(0) for name in cl.META_COLUMNS}
    again = assemble(schema, columns, op=meta[cl.OP], lsn=meta[cl.COMMIT_LSN], seq=meta[cl.SEQ],
                     xid=meta[cl.XID], ts=pa.array([T0, T0], pa.timestamp("us", tz="UTC")),
                     unchanged=meta[cl.UNCHANGED], old=meta[cl.OLD])  # fmt: skip
    assert again.equals(table)  # timestamps as they are, and arrays of NULLs, taken as given


def test_a_truncates_row_is_the_reference_decoders() -> None:
    found = changes([TruncateMessage(None, 0, (1,))])
    (change,) = found
    micros = int((T0 - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) / dt.timedelta(microseconds=1))
    row = truncate_row(change.table, 0x1000, change.seq, 100, micros)
    want = batch_of(found).to_arrow()
    assert row.schema.equals(want.schema, check_metadata=True)
    assert row.equals(want)
