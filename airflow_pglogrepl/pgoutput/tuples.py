"""TupleData: the column values of an Insert, Update or Delete, read from the message's bytes.

``parse_tuple`` reads every kind of column and checks each read; ``tuple_parser`` and
``row_parser`` generate, once per column count, straight-line readers for the common case
(text, NULL and unchanged-TOAST columns) that hand anything else back to the checked path.
These are the decoder's hot loops: ``parser`` parses whole messages around them, and
``table_info.TableInfo`` keeps the generated readers of its column count.
See https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html (TupleData)
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, TypeAlias

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.pgoutput.layouts import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_TOAST,
    ROW_TUPLE,
)
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST, Binary, message_type_name

__all__ = [
    "BinaryRow",
    "TupleParser",
    "as_bytes",
    "parse_tuple",
    "row_parser",
    "tuple_parser",
]

_U16 = struct.Struct("!H").unpack_from
_U32 = struct.Struct("!I").unpack_from


class BinaryRow(list[Any]):
    """Tuple values holding at least one ``'b'`` (binary) column; plain lists hold none.

    Lets value conversion pick binary-aware converters once per row instead of per value.
    """

    __slots__ = ()


def parse_tuple(data: bytes, pos: int, mtype: str) -> tuple[list[Any], int]:
    """Read TupleData at ``pos``: (column values, position after it).

    Values are None (``n``), ``UNCHANGED_TOAST`` (``u``), ``bytes`` (``t``, UTF-8 text) or
    ``Binary`` (``b``); the list is a ``BinaryRow`` when any column is binary. This is the hot
    loop of the decoder: bounds are checked by catching the exceptions the reads raise and by one
    comparison per value, not by a method call per read.
    """
    end = len(data)
    column = -1
    try:
        (natts,) = _U16(data, pos)
        pos += 2
        values: list[Any] = [None] * natts
        binary = False
        for column in range(natts):
            kind = data[pos]
            if kind in (KIND_TEXT, KIND_BINARY):
                (size,) = _U32(data, pos + 1)
                pos += 5
                stop = pos + size
                if stop > end:
                    raise DecodeError(
                        mtype, end, f"column {column} claims {size} bytes, {end - pos} remain"
                    )
                if kind == KIND_TEXT:
                    values[column] = data[pos:stop]
                else:
                    values[column] = Binary(data[pos:stop])
                    binary = True
                pos = stop
            elif kind == KIND_NULL:
                pos += 1
            elif kind == KIND_TOAST:
                values[column] = UNCHANGED_TOAST
                pos += 1
            else:
                raise DecodeError(
                    mtype, pos, f"column {column} has unknown kind {message_type_name(kind)!r}"
                )
    except (IndexError, struct.error):
        what = "column count" if column < 0 else f"column {column}"
        raise DecodeError(mtype, min(pos, end), f"tuple data ends inside {what}") from None
    return (BinaryRow(values) if binary else values), pos


TupleParser: TypeAlias = Callable[[bytes, int, str], tuple[list[Any], int]]
_FAST_CACHE: dict[int, TupleParser] = {}


class _FallbackError(Exception):
    """Not the common case (binary column, wrong column count): let parse_tuple handle it."""


def tuple_parser(natts: int) -> TupleParser:
    """A TupleData reader specialised for ``natts`` columns of text, NULL or unchanged TOAST.

    Same contract as ``parse_tuple``, about twice as fast: the per-column loop is unrolled into
    straight-line code (generated once per column count, like ``collections.namedtuple`` does),
    which is what CPython runs fastest. It does not check anything it can leave to the
    exceptions the reads raise and to one final bounds test; whenever something is off (a binary
    column, another column count, a short buffer) it hands the whole tuple to ``parse_tuple``,
    which reports precisely what is wrong.
    """
    cached = _FAST_CACHE.get(natts)
    if cached is not None:
        return cached
    names = [f"v{i}" for i in range(natts)]
    lines = [
        "def parse(data, pos, mtype):",
        "    start = pos",
        "    try:",
        f"        if data[pos] != {natts >> 8} or data[pos + 1] != {natts & 0xFF}:",
        "            raise _FallbackError",
        "        pos += 2",
    ]
    for name in names:
        lines += [
            "        kind = data[pos]",
            f"        if kind == {KIND_TEXT}:",
            "            stop = pos + 5 + _U32(data, pos + 1)[0]",
            f"            {name} = data[pos + 5 : stop]",
            "            pos = stop",
            f"        elif kind == {KIND_NULL}:",
            f"            {name} = None",
            "            pos += 1",
            f"        elif kind == {KIND_TOAST}:",
            f"            {name} = UNCHANGED_TOAST",
            "            pos += 1",
            "        else:",
            "            raise _FallbackError",
        ]
    lines += [
        "        if pos > len(data):",
        "            raise _FallbackError",
        "    except (_FallbackError, IndexError, struct.error):",
        "        return parse_tuple(data, start, mtype)",
        f"    return [{', '.join(names)}{',' if natts == 1 else ''}], pos",
    ]
    namespace: dict[str, Any] = {
        "_U32": _U32,
        "_FallbackError": _FallbackError,
        "UNCHANGED_TOAST": UNCHANGED_TOAST,
        "parse_tuple": parse_tuple,
        "struct": struct,
    }
    exec("\n".join(lines), namespace)  # generated from integers only
    parser: TupleParser = namespace["parse"]
    _FAST_CACHE[natts] = parser
    return parser


_ROW_CACHE: dict[int, Callable[[bytes], list[Any] | None]] = {}


def row_parser(natts: int) -> Callable[[bytes], list[Any] | None]:
    """``f(message) -> values | None``: the new tuple of a plain Insert/Update (at offset 6).

    The fastest path of all, for messages that are exactly a 1-byte type, a relation OID, ``N``
    and ``natts`` text/NULL/unchanged columns, ending where the last column ends. It returns None
    for anything else (and never raises), and the caller then decodes the message on the checked
    path, which names what is wrong.
    """
    cached = _ROW_CACHE.get(natts)
    if cached is not None:
        return cached
    lines = [
        "def parse(data):",
        "    try:",
        f"        if data[{ROW_TUPLE}] != {natts >> 8} or data[{ROW_TUPLE + 1}] != {natts & 0xFF}:",
        "            return None",
        f"        pos = {ROW_TUPLE + 2}",
    ]
    names = [f"v{i}" for i in range(natts)]
    for name in names:
        lines += [
            f"        if data[pos] == {KIND_TEXT}:",
            "            stop = pos + 5 + _U32(data, pos + 1)[0]",
            f"            {name} = data[pos + 5 : stop]",
            "            pos = stop",
            f"        elif data[pos] == {KIND_NULL}:",
            f"            {name} = None",
            "            pos += 1",
            f"        elif data[pos] == {KIND_TOAST}:",
            f"            {name} = UNCHANGED_TOAST",
            "            pos += 1",
            "        else:",
            "            return None",
        ]
    lines += [
        "    except (IndexError, struct.error):",
        "        return None",
        "    if pos != len(data):",
        "        return None",
        f"    return [{', '.join(names)}{',' if natts == 1 else ''}]",
    ]
    namespace: dict[str, Any] = {"_U32": _U32, "UNCHANGED_TOAST": UNCHANGED_TOAST, "struct": struct}
    exec("\n".join(lines), namespace)  # generated from integers only
    parser: Callable[[bytes], list[Any] | None] = namespace["parse"]
    _ROW_CACHE[natts] = parser
    return parser


def as_bytes(data: object) -> bytes:
    """A pgoutput row's message as ``bytes`` (copied from a ``bytearray`` or ``memoryview``);
    anything else is not pgoutput's binary output."""
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(
        f"pgoutput rows carry bytes (pg_logical_slot_peek_binary_changes), got "
        f"{type(data).__name__}: is this a text plugin's slot (test_decoding)? The drain reads "
        f"pgoutput slots only"
    )
