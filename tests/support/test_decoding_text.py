"""TestDecodingStream: test_decoding's text lines to the same records pgoutput gives."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import (
    UNCHANGED_TOAST,
    Change,
    LogicalMessage,
    TransactionBegin,
    TransactionCommit,
)
from airflow_pglogrepl.pgoutput.changes import Event
from tests.support.decoding_text import TestDecodingStream, parse_tuple_text

COMMIT_TS = dt.datetime(2015, 3, 13, 7, 3, 49, 803582, tzinfo=dt.UTC)


def decode(*lines: str, xid: int = 9736) -> list[Event]:
    rows = [(LSN(0x7FE6C80 + 0x10 * i), xid, line) for i, line in enumerate(lines)]
    return list(TestDecodingStream().decode(rows))


def rows_of(events: list[Event]) -> list[tuple[str, str, Any, Any, frozenset[str]]]:
    return [
        (e.op, ".".join(e.relation), e.old, e.new, e.unchanged_toast)
        for e in events
        if isinstance(e, Change)
    ]


def test_the_seed_examples() -> None:
    # the replica identity walk-through: default identity (the primary key k)
    events = decode(
        "BEGIN 9736",
        "table public.test: INSERT: k[text]:'Alice' v[integer]:1",
        "table public.test: INSERT: k[text]:'Bob' v[integer]:2",
        "table public.test: UPDATE: k[text]:'Alice' v[integer]:3",
        "table public.test: UPDATE: old-key: k[text]:'Bob' new-tuple: k[text]:'Oscar' v[integer]:2",
        "table public.test: DELETE: k[text]:'Alice'",
        "COMMIT 9736 (at 2015-03-13 15:03:49.803582+08)",
    )
    assert rows_of(events) == [
        ("I", "public.test", None, {"k": "Alice", "v": 1}, frozenset()),
        ("I", "public.test", None, {"k": "Bob", "v": 2}, frozenset()),
        ("U", "public.test", None, {"k": "Alice", "v": 3}, frozenset()),
        ("U", "public.test", {"k": "Bob"}, {"k": "Oscar", "v": 2}, frozenset()),
        ("D", "public.test", {"k": "Alice"}, None, frozenset()),
    ]
    begin = TransactionBegin(9736, None, COMMIT_TS)
    assert events[0] == begin
    assert events[-1] == TransactionCommit(9736, None, LSN(0x7FE6C80 + 0x60), COMMIT_TS, 5)
    change = events[1]
    assert isinstance(change, Change)
    assert (change.xid, change.seq, change.lsn, change.commit_ts) == (
        9736, 0, LSN(0x7FE6C90), COMMIT_TS
    )  # fmt: skip


def test_seed_replica_identity_nothing_and_full() -> None:
    events = decode(
        "BEGIN",
        "table public.test: DELETE: (no-tuple-data)",
        "table public.test: UPDATE: old-key: k[text]:'Bob' v[integer]:2 new-tuple: "
        "k[text]:'Oscar' v[integer]:2",
        "COMMIT",
    )
    assert rows_of(events) == [
        ("D", "public.test", None, None, frozenset()),
        ("U", "public.test", {"k": "Bob", "v": 2}, {"k": "Oscar", "v": 2}, frozenset()),
    ]
    assert events[0] == TransactionBegin(9736, None, None)  # no include-xids: the row's xid


def test_the_logical_decoding_seed_example() -> None:
    events = decode(
        "BEGIN 9736",
        "table public.test: INSERT: col[integer]:2",
        "COMMIT 9736 (at 2015-03-13 15:03:49.803582+08)",
    )
    assert rows_of(events) == [("I", "public.test", None, {"col": 2}, frozenset())]


def test_quoting_and_special_values() -> None:
    line = (
        'table "My Schema"."odd ""name""": INSERT: "Col A"[text]:\'it\'\'s\' '
        "b[boolean]:true n[numeric]:NaN f[double precision]:-Infinity z[text]:null "
        "t[text]:unchanged-toast-datum bits[bit varying]:B'0101' "
        "a[integer[]]:'{1,NULL}' ts[timestamp with time zone]:'2024-01-02 03:04:05+00' "
        "e[text]:'' sp[text]:'a b: c[text]:d'"
    )
    (change,) = [e for e in decode("BEGIN 1", line, "COMMIT 1") if isinstance(e, Change)]
    assert change.relation == ("My Schema", 'odd "name"')
    new = change.new
    assert new is not None
    assert new.pop("n").is_nan()
    assert new == {
        "Col A": "it's",
        "b": True,
        "f": float("-inf"),
        "z": None,
        "bits": "0101",
        "a": [1, None],
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "e": "",
        "sp": "a b: c[text]:d",
    }
    assert change.unchanged_toast == {"t"}
    assert [c.type_name for c in change.table.columns][:3] == ["text", "boolean", "numeric"]


def test_parse_tuple_text_stops_at_new_tuple() -> None:
    line = " k[text]:'x' new-tuple: k[text]:'y'"
    columns, pos = parse_tuple_text(line, 0)
    assert columns == [("k", "text", "x")] and line[pos:].startswith(" new-tuple:")
    assert parse_tuple_text(" u[text]:unchanged-toast-datum", 0)[0] == [
        ("u", "text", UNCHANGED_TOAST)
    ]


def test_old_tuples_skip_nulls_and_keep_the_table_shape() -> None:
    events = decode(
        "BEGIN 1",
        "table public.t: INSERT: id[integer]:1 a[text]:null b[numeric]:1.50",
        "table public.t: DELETE: id[integer]:1 b[numeric]:1.50",
        "COMMIT 1",
    )
    insert, delete = [e for e in events if isinstance(e, Change)]
    assert delete.old == {"id": 1, "b": Decimal("1.50")}  # a (NULL) was not printed
    assert delete.table is insert.table


def test_truncate_of_several_tables() -> None:
    events = decode(
        "BEGIN 1",
        "table public.a, public.b: TRUNCATE: restart_seqs cascade",
        "table public.a: TRUNCATE: (no-flags)",
        "COMMIT 1",
    )
    truncates = [(e.relation, e.cascade, e.restart_identity, e.seq) for e in events
                 if isinstance(e, Change)]  # fmt: skip
    assert truncates == [
        (("public", "a"), True, True, 0),
        (("public", "b"), True, True, 1),
        (("public", "a"), False, False, 2),
    ]


def test_messages() -> None:
    events = decode(
        "message: transactional: 0 prefix: p, sz: 5 content:hello",
        "BEGIN 7",
        "message: transactional: 1 prefix: odd, sz: 3 prefix, sz: 4 content:\u00e9\u00e9",
        "COMMIT 7",
    )
    begin = TransactionBegin(7, None, None)
    assert events == [
        LogicalMessage(LSN(0x7FE6C80), False, "p", b"hello"),
        begin,
        LogicalMessage(
            LSN(0x7FE6CA0), True, "odd, sz: 3 prefix", "\u00e9\u00e9".encode(), begin, 0
        ),
        TransactionCommit(7, None, LSN(0x7FE6CB0), None, 1),
    ]


def test_transactional_message_whose_begin_was_skipped() -> None:
    # skip-empty-xacts prints no BEGIN/COMMIT around a transaction that only emitted a message
    assert decode("message: transactional: 1 prefix: p, sz: 1 content:x") == [
        LogicalMessage(LSN(0x7FE6C80), True, "p", b"x")
    ]


def test_two_phase() -> None:
    events = decode(
        "BEGIN 728",
        "table public.t: INSERT: id[integer]:3",
        "PREPARE TRANSACTION 'g1', txid 728 (at 2026-11-22 05:10:25.790841+00)",
        "BEGIN 729",
        "table public.t: INSERT: id[integer]:4",
        "PREPARE TRANSACTION E'it''s\\\\x'",
        "ROLLBACK PREPARED E'it''s\\\\x', txid 729 (at 2026-11-22 05:10:26+00)",
        "COMMIT PREPARED 'g1', txid 728 (at 2026-11-22 05:10:25.791019+00)",
    )
    when = dt.datetime(2026, 11, 22, 5, 10, 25, 791019, tzinfo=dt.UTC)
    begin = TransactionBegin(728, None, when, "g1")
    assert [type(e).__name__ for e in events] == ["TransactionBegin", "Change", "TransactionCommit"]
    assert events[0] == begin
    assert events[2] == TransactionCommit(728, None, LSN(0x7FE6C80 + 0x70), when, 1, "g1")


def test_commit_prepared_of_an_unseen_prepare() -> None:
    with pytest.raises(DecodeError, match="did not see"):
        decode("COMMIT PREPARED 'x', txid 1")


def test_empty_transactions() -> None:
    assert decode("BEGIN 5", "COMMIT 5") == [
        TransactionBegin(5, None, None),
        TransactionCommit(5, None, LSN(0x7FE6C90), None, 0),
    ]


@pytest.mark.parametrize(
    ("lines", "kind", "message"),
    [
        (["table public.t: INSERT: a[integer]:1"], "table", "outside a transaction"),
        (["COMMIT 1"], "COMMIT", "COMMIT without BEGIN"),
        (["BEGIN 1", "BEGIN 2"], "BEGIN", "while transaction 1 is open"),
        (["BEGIN 1", "COMMIT 2"], "COMMIT", "COMMIT of xid 2, BEGIN was 1"),
        (["BEGIN 1", "table public.t: INSERT: a[integer]:'oops"], "INSERT", "unterminated"),
        (["BEGIN 1", "table public.t: INSERT: a[integer:1"], "INSERT", "not closed by"),
        (["BEGIN 1", "table public.t: INSERT: a[integer]:"], "INSERT", "has no value"),
        (["BEGIN 1", "table public.t: INSERT:x"], "INSERT", "expected ' ' before a column"),
        (["BEGIN 1", "table public.t: MERGE: a[integer]:1"], "table", "expected INSERT"),
        (["BEGIN 1", "table t: INSERT: a[integer]:1"], "table", "expected '.'"),
        (["BEGIN 1", 'table "public.t: INSERT:'], "table", "unterminated quoted identifier"),
        (["BEGIN 1", "table public.t: TRUNCATE: sometimes"], "TRUNCATE", "unknown option"),
        (["BEGIN 1", "table public.t: UPDATE: old-key: a[integer]:1"], "UPDATE", "new-tuple"),
        (["BEGIN 1", "COMMIT 1 (at yesterday)"], "COMMIT", "cannot read timestamp"),
        (["message: transactional: 0 prefix: p, sz: 9 content:x"], "message", "sz"),
        (["opening a streamed block for transaction TXN 5"], "opening", "stream-changes"),
        (["what is this"], "what", "not a test_decoding line"),
    ],
)
def test_malformed_lines(lines: list[str], kind: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message) as info:
        decode(*lines)
    assert info.value.message_type == kind
    assert any("test_decoding row at LSN" in note for note in info.value.__notes__)


def test_bytes_rows_are_refused() -> None:
    with pytest.raises(TypeError, match="carry text"):
        list(TestDecodingStream().decode([(LSN(1), 1, b"BEGIN 1")]))


def test_is_not_collected_as_a_test_class() -> None:
    assert TestDecodingStream.__test__ is False
