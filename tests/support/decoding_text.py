"""``TestDecodingStream``: test_decoding's text rows in, the same ``Change`` records out.

test_decoding (contrib/test_decoding, shipped with PostgreSQL) prints each change as a line such
as ``table public.test: UPDATE: old-key: k[text]:'Bob' new-tuple: k[text]:'Oscar' v[integer]:2``.
Slots created with it can be drained like pgoutput slots: this parser reads those lines (quoted
identifiers, literals with doubled quotes, ``null``, ``unchanged-toast-datum``,
``(no-tuple-data)``, BEGIN/COMMIT with xids and timestamps, two-phase lines, messages) and yields
``changes.Event`` records.

What the text format lacks, the records lack too: the commit record's LSN (``commit_lsn`` is
None; ``TransactionCommit.end_lsn`` is the COMMIT row's LSN, as with pgoutput), type modifiers,
which columns form the key, and NULL columns of old tuples (test_decoding skips them). The commit
time is printed after the changes, so each transaction waits in a ``TransactionBuffer`` until its
COMMIT line. ``stream-changes`` output carries no row data and is rejected.
See https://www.postgresql.org/docs/15/test-decoding.html
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from airflow_pglogrepl.exceptions import DecodeError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.buffer import InMemoryTransactionBuffer, TransactionBuffer
from airflow_pglogrepl.pgoutput.changes import (
    FLAG_CASCADE,
    FLAG_RESTART_IDENTITY,
    Change,
    Event,
    LogicalMessage,
    TransactionBegin,
    TransactionCommit,
)
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST
from airflow_pglogrepl.pgoutput.table_info import ABSENT, ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.values import FORMAT_TYPE_NAMES, text_converter

__all__ = ["TestDecodingStream", "parse_tuple_text"]


_BARE_IDENT = re.compile(r"[a-z_][a-z0-9_$]*")
_XID_TS = re.compile(r"(?: (\d+))?(?: \(at (.+)\))?")
_PREPARED = re.compile(
    r"(PREPARE TRANSACTION|COMMIT PREPARED|ROLLBACK PREPARED) (E?'(?:[^']|'')*')"
    r"(?:, txid (\d+))?(?: \(at (.+)\))?"
)
_MESSAGE_HEAD = re.compile(r"message: transactional: ([01]) prefix: ")
_MESSAGE_SIZE = re.compile(r", sz: (\d+) content:")
_NO_TUPLE = " (no-tuple-data)"
_STREAM_LINES = (
    "opening a streamed block",
    "closing a streamed block",
    "streaming change for",
    "streaming truncate for",
    "streaming message:",
    "aborting streamed",
    "committing streamed",
    "preparing streamed",
)

# A tuple column: (name, type name, raw value: str | None | UNCHANGED_TOAST)
_Column = tuple[str, str, Any]


def _identifier(line: str, pos: int, kind: str) -> tuple[str, int]:
    """One identifier as quote_identifier prints it: bare lower-case, or double-quoted."""
    if line.startswith('"', pos):
        out = []
        pos += 1
        while True:
            end = line.find('"', pos)
            if end < 0:
                raise DecodeError(kind, pos, "unterminated quoted identifier")
            out.append(line[pos:end])
            if line.startswith('"', end + 1):  # doubled quote inside the name
                out.append('"')
                pos = end + 2
                continue
            return "".join(out), end + 1
    match = _BARE_IDENT.match(line, pos)
    if match is None:
        raise DecodeError(kind, pos, "expected an identifier")
    return match.group(), match.end()


def _qualified(line: str, pos: int, kind: str) -> tuple[tuple[str, str], int]:
    schema, pos = _identifier(line, pos, kind)
    if not line.startswith(".", pos):
        raise DecodeError(kind, pos, "expected '.' between schema and table name")
    table, pos = _identifier(line, pos + 1, kind)
    return (schema, table), pos


def _literal(line: str, pos: int, kind: str) -> tuple[str, int]:
    """A single-quoted literal starting at ``pos`` (quotes doubled inside)."""
    out = []
    pos += 1
    while True:
        end = line.find("'", pos)
        if end < 0:
            raise DecodeError(kind, pos, "unterminated quoted value")
        out.append(line[pos:end])
        if line.startswith("'", end + 1):
            out.append("'")
            pos = end + 2
            continue
        return "".join(out), end + 1


def parse_tuple_text(line: str, pos: int, kind: str = "table") -> tuple[list[_Column], int]:
    """Columns printed by test_decoding's tuple_to_stringinfo, from ``pos`` (at a space).

    Stops at the end of the line or before `` new-tuple:``. Each column is
    ``(name, type name, value)``, value None for ``null``, ``UNCHANGED_TOAST`` for
    ``unchanged-toast-datum``, else the value's text form.
    """
    columns: list[_Column] = []
    end = len(line)
    while pos < end:
        if line.startswith(" new-tuple:", pos):
            break
        if line[pos] != " ":
            raise DecodeError(kind, pos, "expected ' ' before a column")
        name, pos = _identifier(line, pos + 1, kind)
        if not line.startswith("[", pos):
            raise DecodeError(kind, pos, f"expected '[' after column name {name!r}")
        close = line.find("]:", pos + 1)
        if close < 0:
            raise DecodeError(kind, pos, f"type of column {name!r} is not closed by ']:'")
        type_name = line[pos + 1 : close]
        pos = close + 2
        value: Any
        if line.startswith("'", pos):
            value, pos = _literal(line, pos, kind)
        elif line.startswith("B'", pos):  # bit strings: B'0101'
            value, pos = _literal(line, pos + 1, kind)
        else:
            stop = line.find(" ", pos)
            stop = end if stop < 0 else stop
            token = line[pos:stop]
            if not token:
                raise DecodeError(kind, pos, f"column {name!r} has no value")
            if token == "null":
                value = None
            elif token == "unchanged-toast-datum":
                value = UNCHANGED_TOAST
            else:
                value = token
            pos = stop
        columns.append((name, type_name, value))
    return columns, pos


class TestDecodingStream:
    """Decode test_decoding rows (``pg_logical_slot_peek_changes``) into ``changes`` events.

    Read the slot with ``include-xids`` on (the default) or off, ``include-timestamp`` on for
    commit times, ``skip-empty-xacts`` as you like, and without ``stream-changes``.
    """

    __test__ = False  # not a pytest test class, despite the plugin's name

    def __init__(self, *, buffer: TransactionBuffer | None = None) -> None:
        self._buffer: TransactionBuffer = (
            buffer if buffer is not None else InMemoryTransactionBuffer()
        )
        self._xid: int | None = None  # the open transaction
        self._prepared: dict[str, int] = {}  # gid -> xid, waiting for COMMIT/ROLLBACK PREPARED
        self._shapes: dict[tuple[str, str], TableInfo] = {}

    @property
    def in_transaction(self) -> bool:
        return self._xid is not None

    @property
    def prepared_gids(self) -> list[str]:
        return list(self._prepared)

    def decode(self, rows: Iterable[Sequence[Any]]) -> Iterator[Event]:
        """Decode ``(lsn, xid, data)`` rows in order."""
        for row in rows:
            lsn, xid, line = row[0], row[1], row[2]
            if lsn.__class__ is not LSN:
                lsn = LSN(lsn)
            if not isinstance(line, str):
                raise TypeError(
                    f"test_decoding rows carry text (pg_logical_slot_peek_changes), got "
                    f"{type(line).__name__}"
                )
            try:
                result = self._line(lsn, None if xid is None else int(xid), line)
            except DecodeError as exc:
                exc.add_note(f"test_decoding row at LSN {lsn}: {line[:200]!r}")
                raise
            if result is not None:
                yield from result

    def feed(self, lsn: LSN | int | str, xid: int | None, line: str) -> list[Event]:
        """Decode one row; return the events it completes."""
        return list(self.decode(((lsn, xid, line),)))

    # -- lines ----------------------------------------------------------------------------

    def _line(self, lsn: LSN, row_xid: int | None, line: str) -> Iterable[Event] | None:
        if line.startswith("table "):
            self._change(lsn, line)
            return None
        if line.startswith("BEGIN"):
            self._begin(row_xid, line)
            return None
        if line.startswith("COMMIT PREPARED") or line.startswith("ROLLBACK PREPARED"):
            return self._finish_prepared(lsn, line)
        if line.startswith("COMMIT"):
            return self._commit(lsn, row_xid, line)
        if line.startswith("PREPARE TRANSACTION"):
            self._prepare(line)
            return None
        if line.startswith("message: "):
            return self._message(lsn, line)
        kind = line.split(" ", 1)[0] or "?"
        if line.startswith(_STREAM_LINES):
            raise DecodeError(
                kind, 0, "streamed test_decoding output carries no row data; read the slot "
                "without 'stream-changes'"
            )  # fmt: skip
        raise DecodeError(kind, 0, "not a test_decoding line this parser knows")

    def _begin(self, row_xid: int | None, line: str) -> None:
        if self._xid is not None:
            raise DecodeError("BEGIN", 0, f"BEGIN while transaction {self._xid} is open")
        match = re.fullmatch(r"BEGIN(?: (\d+))?", line)
        if match is None:
            raise DecodeError("BEGIN", 5, "expected 'BEGIN' or 'BEGIN <xid>'")
        xid = int(match.group(1)) if match.group(1) else row_xid
        if xid is None:
            raise DecodeError("BEGIN", 0, "no xid: neither include-xids nor the row's xid")
        self._xid = xid
        self._buffer.open(("txn", xid))

    def _commit(self, lsn: LSN, row_xid: int | None, line: str) -> Iterator[Event]:
        xid = self._xid
        if xid is None:
            raise DecodeError("COMMIT", 0, "COMMIT without BEGIN")
        match = _XID_TS.fullmatch(line, 6)
        if match is None:
            raise DecodeError("COMMIT", 6, "expected 'COMMIT [<xid>] [(at <timestamp>)]'")
        if match.group(1) is not None and int(match.group(1)) != xid:
            raise DecodeError("COMMIT", 7, f"COMMIT of xid {match.group(1)}, BEGIN was {xid}")
        commit_ts = _timestamp(match.group(2), "COMMIT", line)
        self._xid = None
        items = self._buffer.pop(("txn", xid))
        begin = TransactionBegin(xid, None, commit_ts)
        return _deliver(begin, items, lsn)

    def _prepare(self, line: str) -> None:
        xid = self._xid
        match = _PREPARED.fullmatch(line)
        if xid is None or match is None:
            raise DecodeError("PREPARE", 0, "PREPARE TRANSACTION without BEGIN, or malformed")
        gid = _gid(match.group(2))
        if match.group(3) is not None and int(match.group(3)) != xid:
            raise DecodeError("PREPARE", 0, f"PREPARE of xid {match.group(3)}, BEGIN was {xid}")
        self._xid = None
        self._buffer.rename(("txn", xid), ("prepared", gid))
        self._prepared[gid] = xid

    def _finish_prepared(self, lsn: LSN, line: str) -> Iterator[Event] | None:
        kind = line.split(" ", 1)[0]
        match = _PREPARED.fullmatch(line)
        if match is None:
            raise DecodeError(kind, 0, "malformed COMMIT/ROLLBACK PREPARED line")
        gid = _gid(match.group(2))
        xid = self._prepared.pop(gid, None)
        if kind == "ROLLBACK":
            self._buffer.discard(("prepared", gid))
            return None
        if xid is None:
            raise DecodeError(
                kind,
                0,
                f"COMMIT PREPARED {gid!r} for a transaction whose PREPARE this decoding session "
                f"did not see; never advance a two-phase slot past an open prepared transaction",
            )
        items = self._buffer.pop(("prepared", gid))
        begin = TransactionBegin(xid, None, _timestamp(match.group(4), kind, line), gid)
        return _deliver(begin, items, lsn)

    def _message(self, lsn: LSN, line: str) -> Iterator[Event] | None:
        head = _MESSAGE_HEAD.match(line)
        if head is None:
            raise DecodeError("message", 0, "malformed message line")
        transactional = head.group(1) == "1"
        # the prefix may itself contain ', sz: '; the size says where the content starts
        encoded = line.encode()
        for size_match in _MESSAGE_SIZE.finditer(line, head.end()):
            size = int(size_match.group(1))
            start = len(line[: size_match.end()].encode())
            if len(encoded) - start == size:
                prefix = line[head.end() : size_match.start()]
                content = encoded[start:]
                break
        else:
            raise DecodeError("message", head.end(), "content length does not match 'sz'")
        if self._xid is None:
            # non-transactional, or transactional in a transaction that wrote nothing else, whose
            # BEGIN/COMMIT 'skip-empty-xacts' suppressed: delivered alone either way
            return iter((LogicalMessage(lsn, transactional, prefix, content),))
        if not transactional:
            return iter((LogicalMessage(lsn, False, prefix, content),))
        self._buffer.append(("txn", self._xid), self._xid, ("M", None, lsn, prefix, content, 1))
        return None

    # -- changes --------------------------------------------------------------------------

    def _change(self, lsn: LSN, line: str) -> None:
        xid = self._xid
        if xid is None:
            raise DecodeError("table", 0, "change outside a transaction")
        relations = []
        pos = 6
        while True:
            relation, pos = _qualified(line, pos, "table")
            relations.append(relation)
            if line.startswith(", ", pos):
                pos += 2
                continue
            break
        if not line.startswith(": ", pos):
            raise DecodeError("table", pos, "expected ': ' after the table name")
        pos += 2
        key = ("txn", xid)
        for op_name, op in (("INSERT:", "I"), ("UPDATE:", "U"), ("DELETE:", "D")):
            if line.startswith(op_name, pos):
                if len(relations) != 1:
                    raise DecodeError(op_name[:-1], pos, "one table expected")
                item = self._row_change(op, relations[0], lsn, line, pos + len(op_name))
                self._buffer.append(key, xid, item)
                return
        if not line.startswith("TRUNCATE:", pos):
            raise DecodeError("table", pos, "expected INSERT, UPDATE, DELETE or TRUNCATE")
        flags_text = line[pos + 9 :]
        flags = 0
        if flags_text != " (no-flags)":
            for word in flags_text.split(" ")[1:]:
                if word == "restart_seqs":
                    flags |= FLAG_RESTART_IDENTITY
                elif word == "cascade":
                    flags |= FLAG_CASCADE
                else:
                    raise DecodeError("TRUNCATE", pos + 9, f"unknown option {word!r}")
        for relation in relations:
            table = self._shapes.get(relation) or TableInfo(*relation, (), source="text")
            self._buffer.append(key, xid, ("T", table, lsn, None, None, flags))

    def _row_change(
        self, op: str, relation: tuple[str, str], lsn: LSN, line: str, pos: int
    ) -> tuple[str, TableInfo, LSN, Any, Any, int]:
        kind = {"I": "INSERT", "U": "UPDATE", "D": "DELETE"}[op]
        old_columns: list[_Column] | None = None
        new_columns: list[_Column] | None = None
        if op == "U" and line.startswith(" old-key:", pos):
            old_columns, pos = parse_tuple_text(line, pos + 9, kind)
            if not line.startswith(" new-tuple:", pos):
                raise DecodeError(kind, pos, "expected ' new-tuple:' after the old key")
            pos += 11
        if line.startswith(_NO_TUPLE, pos):  # nothing logged (REPLICA IDENTITY NOTHING ...)
            pos += len(_NO_TUPLE)
        elif op == "D":
            old_columns, pos = parse_tuple_text(line, pos, kind)
        else:
            new_columns, pos = parse_tuple_text(line, pos, kind)
        if pos != len(line):
            raise DecodeError(kind, pos, "unexpected text after the tuple")
        table = self._table(relation, new_columns, old_columns)
        new = None if new_columns is None else [value for _, _, value in new_columns]
        old = None
        if old_columns is not None:
            printed = {name: value for name, _, value in old_columns}
            old = [printed.get(name, ABSENT) for name in table.names]
        return (op, table, lsn, new, old, 0)

    def _table(
        self,
        relation: tuple[str, str],
        new: list[_Column] | None,
        old: list[_Column] | None,
    ) -> TableInfo:
        known = self._shapes.get(relation)
        if new is not None:
            shape = [(name, type_name) for name, type_name, _ in new]
            if known is None or _shape(known) != shape:
                known = _text_table(relation, shape)
                self._shapes[relation] = known
            return known
        shape = [(name, type_name) for name, type_name, _ in old or ()]
        if known is not None and set(shape) <= set(_shape(known)):
            return known
        table = _text_table(relation, shape)  # only the printed columns are known
        if known is None:
            self._shapes[relation] = table
        return table


def _shape(table: TableInfo) -> list[tuple[str, str]]:
    return [(c.name, c.type_name or "") for c in table.columns]


def _text_table(relation: tuple[str, str], shape: list[tuple[str, str]]) -> TableInfo:
    columns = []
    for name, type_name in shape:
        oid = FORMAT_TYPE_NAMES.get(type_name, 0)
        value_oid = oid if oid and text_converter(oid) is not None else None
        columns.append(ColumnInfo(name, oid, -1, False, value_oid, type_name))
    return TableInfo(relation[0], relation[1], columns, source="text")


def _gid(quoted: str) -> str:
    # quote_literal_cstr: quotes doubled; with a backslash inside, E'' and backslashes doubled
    if quoted.startswith("E"):
        return quoted[2:-1].replace("''", "'").replace("\\\\", "\\")
    return quoted[1:-1].replace("''", "'")


def _timestamp(text: str | None, kind: str, line: str) -> dt.datetime | None:
    if text is None:
        return None
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise DecodeError(
            kind, line.find(text), f"cannot read timestamp {text!r} (DateStyle must be ISO)"
        ) from None


def _deliver(begin: TransactionBegin, items: Sequence[Any], end_lsn: LSN) -> Iterator[Event]:
    yield begin
    seq = 0
    for op, table, lsn, new, old, flags in items:
        if op == "M":
            yield LogicalMessage(lsn, True, new, old, begin, seq)
        else:
            yield Change(op, table, begin, lsn, seq, new, old, flags)
        seq += 1
    yield TransactionCommit(begin.xid, None, end_lsn, begin.commit_ts, seq, begin.gid)
