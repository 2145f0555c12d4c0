"""TupleData, read three ways: the checked ``parse_tuple``, and the generated ``tuple_parser``
and ``row_parser`` that must give the same values wherever they answer and hand everything else
(binary columns, another column count, short or long buffers) back to the checked path."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST, Binary
from airflow_pglogrepl.pgoutput.tuples import (
    BinaryRow,
    as_bytes,
    parse_tuple,
    row_parser,
    tuple_parser,
)
from tests.support.pgoutput_encoder import u16, u32


def test_fast_tuple_parser_matches_the_checked_one() -> None:
    data = b"xx" + u16(3) + b"t" + u32(2) + b"ab" + b"n" + b"u"
    assert (
        tuple_parser(3)(data, 2, "I")
        == parse_tuple(data, 2, "I")
        == (
            [b"ab", None, UNCHANGED_TOAST],
            len(data),
        )
    )
    # another column count or a binary column: same answer, through the checked parser
    assert tuple_parser(2)(data, 2, "I") == parse_tuple(data, 2, "I")
    binary = u16(1) + b"b" + u32(1) + b"\x01"
    assert tuple_parser(1)(binary, 0, "I") == ([Binary(b"\x01")], len(binary))


@pytest.mark.parametrize("natts", [0, 1, 3])
def test_fast_tuple_parser_reports_truncation_like_the_checked_one(natts: int) -> None:
    data = u16(natts) + (b"t" + u32(3) + b"abc") * natts
    for cut in range(len(data)):
        with pytest.raises(DecodeError) as fast:
            tuple_parser(natts)(data[:cut], 0, "I")
        with pytest.raises(DecodeError) as checked:
            parse_tuple(data[:cut], 0, "I")
        assert (fast.value.offset, fast.value.reason) == (
            checked.value.offset,
            checked.value.reason,
        )


def test_a_binary_column_makes_the_row_a_binary_row() -> None:
    text = u16(2) + b"t" + u32(1) + b"a" + b"n"
    binary = u16(2) + b"t" + u32(1) + b"a" + b"b" + u32(2) + b"\x00\x07"
    plain, _ = parse_tuple(text, 0, "I")
    mixed, end = parse_tuple(binary, 0, "I")
    assert type(plain) is list
    assert type(mixed) is BinaryRow
    assert (mixed, end) == ([b"a", Binary(b"\x00\x07")], len(binary))


def test_unknown_kind_names_the_column_and_its_offset() -> None:
    data = u16(2) + b"n" + b"x"
    with pytest.raises(DecodeError, match="column 1 has unknown kind 'x'") as info:
        parse_tuple(data, 0, "U")
    assert (info.value.message_type, info.value.offset) == ("U", 3)


def _insert(tuple_data: bytes) -> bytes:
    return b"I" + u32(16384) + b"N" + tuple_data


def test_row_parser_reads_a_plain_insert_like_the_checked_parser() -> None:
    data = _insert(u16(3) + b"t" + u32(2) + b"ab" + b"n" + b"u")
    assert row_parser(3)(data) == parse_tuple(data, 6, "I")[0] == [b"ab", None, UNCHANGED_TOAST]
    one = _insert(u16(1) + b"t" + u32(0))
    assert row_parser(1)(one) == [b""]


@pytest.mark.parametrize(
    "data",
    [
        _insert(u16(2) + b"t" + u32(1) + b"a"),  # another column count
        _insert(u16(1) + b"b" + u32(1) + b"a"),  # a binary column
        _insert(u16(1) + b"t" + u32(1) + b"a" + b"!"),  # bytes after the tuple
        _insert(u16(1) + b"t" + u32(5) + b"a"),  # a column longer than the message
        _insert(u16(1) + b"x"),  # an unknown kind
        _insert(u16(1))[:7],  # ends inside the column count
    ],
)
def test_row_parser_declines_anything_else_without_raising(data: bytes) -> None:
    assert row_parser(1)(data) is None


def test_generated_parsers_are_made_once_per_column_count() -> None:
    assert tuple_parser(4) is tuple_parser(4)
    assert row_parser(4) is row_parser(4)
    assert tuple_parser(4) is not tuple_parser(5)


def test_rows_are_bytes_or_copied_to_bytes() -> None:
    assert as_bytes(bytearray(b"I\x00")) == b"I\x00"
    assert as_bytes(memoryview(b"B\x01")) == b"B\x01"
    assert type(as_bytes(memoryview(b"B"))) is bytes
    with pytest.raises(TypeError, match="pgoutput slots only"):
        as_bytes("BEGIN 1")
