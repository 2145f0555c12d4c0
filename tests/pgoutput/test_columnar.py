"""The columnar back end's parse, below the changelog: which transaction and ``_seq`` each
message gets (a transaction open across batches included), which changes belong to which table
description (a table described again mid-batch), where each column's value lies in the buffer,
and what it declines to the per-message back end. (Its rows against the reference decoder's:
tests/changelog/test_columnar.py.)"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import layouts as lay
from airflow_pglogrepl.pgoutput.columnar import (
    ColumnarParser,
    ColumnarUnsupportedError,
    ParsedBatch,
    parse_rows,
)
from airflow_pglogrepl.pgoutput.messages import (
    UNCHANGED_TOAST,
    BeginMessage,
    CommitMessage,
    DeleteMessage,
    InsertMessage,
    LogicalDecodingMessage,
    UpdateMessage,
)
from airflow_pglogrepl.pgoutput.values import OID
from tests.support.pgoutput_encoder import encode, relation

pytestmark = pytest.mark.unit

OPTIONS = {"proto_version": "1", "publication_names": "p"}
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
SPEC = [("id", OID.INT4, True), ("v", OID.TEXT)]


def _batch(*messages: object) -> pa.Array:
    return pa.array([encode(m) for m in messages], pa.binary())  # type: ignore[arg-type]


def _parsed(parser: ColumnarParser, *messages: object) -> ParsedBatch:
    batch = parser.parse(_batch(*messages))
    assert batch is not None
    return batch


def test_each_change_gets_its_transaction_and_its_place_in_it() -> None:
    parser = ColumnarParser(OPTIONS)
    batch = _parsed(
        parser,
        relation(7, "t", SPEC),
        BeginMessage(LSN(0x500), T0, 9),
        InsertMessage(None, 7, ("1", "a")),
        UpdateMessage(None, 7, "K", ("1", None), ("1", "b")),
        CommitMessage(0, LSN(0x500), LSN(0x510), T0),
        BeginMessage(LSN(0x600), T0, 10),
        DeleteMessage(None, 7, "K", ("1", None)),
        CommitMessage(0, LSN(0x600), LSN(0x610), T0),
    )
    assert batch.kinds.tolist() == [ord(k) for k in "RBIUCBDC"]
    changes = [2, 3, 6]
    assert batch.seq[changes].tolist() == [0, 1, 0]
    assert [batch.txns[int(i)].commit_lsn for i in batch.txn_of[changes]] == [0x500, 0x500, 0x600]
    assert [batch.txns[int(i)].xid for i in batch.txn_of[changes]] == [9, 9, 10]
    stamp = batch.txns[int(batch.txn_of[2])].commit_ts_us
    assert stamp == int(T0.timestamp()) * 1_000_000 + T0.microsecond
    ((table, rows),) = batch.changes
    assert table.table == "t" and rows.tolist() == changes
    assert parser.transactions == 2 and parser.commit_lsns == [0x500, 0x600]


def test_a_transaction_open_at_the_end_of_a_batch_goes_on_in_the_next() -> None:
    parser = ColumnarParser(OPTIONS)
    first = _parsed(parser, relation(7, "t", SPEC), BeginMessage(LSN(0x500), T0, 9),
                    InsertMessage(None, 7, ("1", "a")))  # fmt: skip
    assert first.seq[2] == 0 and parser.commit_lsns == []
    second = _parsed(parser, InsertMessage(None, 7, ("2", "b")),
                     CommitMessage(0, LSN(0x500), LSN(0x510), T0))  # fmt: skip
    assert second.seq[0] == 1  # the second change of the transaction begun before
    assert second.txns[int(second.txn_of[0])].xid == 9
    assert parser.commit_lsns == [0x500]


def test_a_table_described_again_mid_batch_splits_its_changes_by_description() -> None:
    parser = ColumnarParser(OPTIONS)
    batch = _parsed(
        parser,
        relation(7, "t", SPEC),
        BeginMessage(LSN(0x500), T0, 9),
        InsertMessage(None, 7, ("1", "a")),
        relation(7, "t", [*SPEC, ("w", OID.INT8)]),  # ALTER TABLE ... ADD COLUMN w
        InsertMessage(None, 7, ("2", "b", "3")),
        CommitMessage(0, LSN(0x500), LSN(0x510), T0),
    )
    (before, rows_before), (after, rows_after) = batch.changes
    assert list(before.names) == ["id", "v"] and rows_before.tolist() == [2]
    assert list(after.names) == ["id", "v", "w"] and rows_after.tolist() == [4]


def test_a_tuple_s_columns_are_where_their_values_lie_in_the_buffer() -> None:
    parser = ColumnarParser(OPTIONS)
    batch = _parsed(
        parser,
        relation(7, "t", SPEC, identity="f"),
        BeginMessage(LSN(0x500), T0, 9),
        InsertMessage(None, 7, ("1", None)),
        UpdateMessage(None, 7, "O", ("1", "old"), ("1", UNCHANGED_TOAST)),
        DeleteMessage(None, 7, "O", ("1", "gone")),
        CommitMessage(0, LSN(0x500), LSN(0x510), T0),
    )
    ((table, rows),) = batch.changes
    parsed = parse_rows(table, batch.buf, batch.starts, batch.ends, batch.kinds, rows)
    assert parsed.has_old.tolist() == [False, True, True]
    assert parsed.new_rows.tolist() == [0, 1] and parsed.deletes.tolist() == [2]
    ids, values = parsed.new_cols
    assert ids.texts(batch.buf).to_pylist() == ["1", "1"]
    assert values.marks.tolist() == [lay.KIND_NULL, lay.KIND_TOAST]
    assert values.texts(batch.buf).to_pylist() == [None, None]
    assert parsed.old_cols is not None
    assert parsed.old_cols[1].texts(batch.buf).to_pylist() == ["old", "gone"]
    assert parsed.old_index[parsed.has_old].tolist() == [0, 1]


@pytest.mark.parametrize(
    ("messages", "declined"),
    [
        ([LogicalDecodingMessage(None, 1, LSN(0x500), "p", b"x")], "message type 'M'"),
        ([InsertMessage(None, 7, ("1", "a"))], "outside a transaction"),
        ([BeginMessage(LSN(0x500), T0, 9), InsertMessage(None, 8, ("1", "a"))],
         "unknown relation 8"),
    ],
)  # fmt: skip
def test_what_it_does_not_take_is_declined_to_the_per_message_back_end(
    messages: list[object], declined: str
) -> None:
    parser = ColumnarParser(OPTIONS)
    parser.parse(_batch(relation(7, "t", SPEC)))
    with pytest.raises(ColumnarUnsupportedError, match=declined):
        parser.parse(_batch(*messages))


def test_streamed_or_binary_sessions_and_empty_batches() -> None:
    for option in ({"streaming": "parallel"}, {"binary": "true"}):
        with pytest.raises(ColumnarUnsupportedError, match="'parallel' and binary tuples"):
            ColumnarParser({**OPTIONS, **option})
    assert ColumnarParser(OPTIONS).parse(pa.array([], pa.binary())) is None
    large = ColumnarParser(OPTIONS).parse(pa.array([encode(relation(7, "t", SPEC))],
                                                   pa.large_binary()))  # fmt: skip
    assert large is not None and large.changes == [] and isinstance(large.buf, np.ndarray)
