"""What a decoded change carries: values converted (with its table's description) only when
asked and then kept, an old key holding only the key, unchanged TOAST columns named and left
out, TRUNCATE's options, and a value that cannot be converted named with its column, table and
type. The description on its own is test_table_info's."""

from __future__ import annotations

import datetime as dt
import pickle

import pytest

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.changes import (
    FLAG_CASCADE,
    FLAG_OLD_IS_KEY,
    FLAG_RESTART_IDENTITY,
    Change,
    TransactionBegin,
)
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST
from tests.support.pgoutput_encoder import table_t

pytestmark = pytest.mark.unit

T0 = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
TXN = TransactionBegin(9, LSN(0x500), T0)


def test_values_are_converted_when_asked_and_an_old_key_holds_only_the_key() -> None:
    change = Change("U", table_t(), TXN, LSN(0x480), 3, [b"1", b"b", b"7"], (b"1", None, None),
                    FLAG_OLD_IS_KEY)  # fmt: skip
    assert change.new == {"id": 1, "v": "b", "n": 7}
    assert change.new is change.new  # converted once, then kept
    assert change.old == {"id": 1}
    assert (change.xid, change.commit_lsn, change.commit_ts) == (9, LSN(0x500), T0)
    assert pickle.loads(pickle.dumps(change)) == change


def test_unchanged_toast_columns_are_named_and_left_out_of_the_row() -> None:
    change = Change("U", table_t(), TXN, LSN(0x480), 0, (b"1", UNCHANGED_TOAST, None), None)
    assert change.new == {"id": 1, "n": None} and change.unchanged_toast == frozenset({"v"})
    assert "unchanged_toast=['v']" in repr(change)


def test_truncate_options_come_from_its_flags() -> None:
    both = Change("T", table_t(), TXN, LSN(0x480), 0, None, None,
                  FLAG_CASCADE | FLAG_RESTART_IDENTITY)  # fmt: skip
    assert both.cascade and both.restart_identity and both.new is None and both.old is None
    plain = Change("T", table_t(), TXN, LSN(0x480), 0, None, None)
    assert not plain.cascade and not plain.restart_identity


def test_a_value_that_cannot_be_converted_names_its_column_table_and_type() -> None:
    change = Change("I", table_t(), TXN, LSN(0x480), 0, [b"1", b"a", b"not a number"], None)
    with pytest.raises(DecodeError, match=r"column 'n' of public\.t \(type bigint\): cannot "
                                          r"convert b'not a number'"):  # fmt: skip
        _ = change.new
