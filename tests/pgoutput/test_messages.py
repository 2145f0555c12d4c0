"""The message records: each message type by the byte the protocol documents it by, the one
unchanged-TOAST marker (not NULL, and still itself after a pickle), binary values told from
text, and the flags of a Truncate and a logical message read as the protocol sets them."""

from __future__ import annotations

import pickle

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import layouts
from airflow_pglogrepl.pgoutput.messages import (
    UNCHANGED_TOAST,
    Binary,
    ColumnKind,
    LogicalDecodingMessage,
    MessageType,
    TruncateMessage,
    UnchangedToast,
    message_type_name,
)

pytestmark = pytest.mark.unit


def test_message_types_are_the_documented_bytes_and_the_layouts_agree() -> None:
    assert "".join(t.char for t in MessageType) == "BCORYIUDTMSEcAbPKrp"
    for member in MessageType:
        assert member == getattr(layouts, member.name), member.name
    kinds = (ColumnKind.NULL, ColumnKind.UNCHANGED_TOAST, ColumnKind.TEXT, ColumnKind.BINARY)
    assert kinds == (ord("n"), ord("u"), ord("t"), ord("b"))


def test_an_unknown_byte_is_named_printably_in_errors() -> None:
    assert message_type_name(ord("I")) == "I"
    assert message_type_name(0) == "\\x00" and message_type_name(0x7F) == "\\x7f"


def test_unchanged_toast_is_one_marker_that_survives_a_pickle_and_is_not_null() -> None:
    assert UnchangedToast() is UNCHANGED_TOAST
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert UNCHANGED_TOAST is not None and repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"


def test_a_binary_value_is_bytes_told_apart_from_text() -> None:
    value = Binary(b"\x00\x01")
    assert (
        value == b"\x00\x01" and isinstance(value, bytes) and repr(value) == "Binary(b'\\x00\\x01')"
    )


@pytest.mark.parametrize(
    ("flags", "cascade", "restart"),
    [(0, False, False), (1, True, False), (2, False, True), (3, True, True)],
)
def test_truncate_flags_read_as_the_protocol_sets_them(
    flags: int, cascade: bool, restart: bool
) -> None:
    message = TruncateMessage(None, flags, (16384,))
    assert (message.cascade, message.restart_identity) == (cascade, restart)


def test_a_logical_message_is_transactional_by_its_first_flag_bit() -> None:
    assert LogicalDecodingMessage(None, 1, LSN(0x10), "p", b"x").transactional
    assert not LogicalDecodingMessage(None, 0, LSN(0x10), "p", b"x").transactional
