"""The lake's quarantine: the changes of a table the lake could not store, kept, so that one
table's bad input never stops the others and never loses a change.

A table's changes cannot be stored when a value does not fit its lake type
(``UnstorableValueError``), when the table changed in a way the lake cannot follow
(``SchemaChangedError``), or when a column has no lake type (``UnsupportedColumnTypeError``).
The drain then writes that table's changes of the window, as PostgreSQL sent them, to the Delta
table ``_pglogrepl/quarantine`` (one row per change: the table, its commit LSN and order, the
operation, the new and old tuples as text, the error), commits every other table as usual, and
moves the slot on. The quarantine commit is part of the window, before its commit point, with
the same app transaction: a window drained again adds nothing twice.

From then on the table is *held*: every later change of it goes to the quarantine too, so its
changelog has no gap, until a re-snapshot of the table covers them (its state then holds every
change before the snapshot's point, and every quarantined change is before it: the slot never
waits for them). The quarantine's rows stay as the record of what happened.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import (
    SchemaChangedError,
    UnstorableValueError,
    UnsupportedColumnTypeError,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.pgoutput.changes import Change

# The errors that are one table's: its changes go to the quarantine, the others go on.
TABLE_ERRORS = (SchemaChangedError, UnstorableValueError, UnsupportedColumnTypeError)


def quarantine_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("table", pa.string()),  # schema.table, as the lake names its directories
            pa.field("commit_lsn", pa.int64()),
            pa.field("seq", pa.int64()),
            pa.field("xid", pa.int64()),
            pa.field("op", pa.string()),  # I, U, D, T
            pa.field("new", pa.string()),  # JSON: column -> text as sent (null: NULL)
            pa.field("old", pa.string()),  # JSON, the old key or row when sent
            pa.field("error", pa.string()),  # the error's class
            pa.field("message", pa.string()),  # what it said of the table
            pa.field("window_start", pa.string()),
            pa.field("window_end", pa.string()),
            pa.field("quarantined_at", pa.timestamp("us", tz="UTC")),
        ]
    )


@dataclass(frozen=True)
class Cause:
    """Why a table is held: the error that sent it to the quarantine, and from which window."""

    error: str
    what: str
    since: str  # the window start (LSN text) of its first quarantined change

    def to_dict(self) -> dict[str, str]:
        return {"error": self.error, "what": self.what, "since": self.since}


def cause_of(exc: Exception, since: str) -> Cause:
    return Cause(type(exc).__name__, str(getattr(exc, "what", exc)), since)


def table_of(exc: Exception) -> str | None:
    """The table (``schema.table``) a table error names; None: not one table's error."""
    if not isinstance(exc, TABLE_ERRORS):
        return None
    table = getattr(exc, "table", None)
    return None if table is None else str(table)


def rows(table: str, changes: Sequence[Change], cause: Cause, start: str, end: str) -> pa.Table:
    """The quarantine rows of ``changes`` (one table's, of the window ``[start, end)``)."""
    import pyarrow as pa

    now = dt.datetime.now(dt.UTC)
    return pa.Table.from_pylist(
        [
            {
                "table": table,
                "commit_lsn": int(c.commit_lsn or 0),
                "seq": c.seq,
                "xid": c.xid,
                "op": str(c.op),
                "new": _tuple_text(c.table.names, c.raw_new),
                "old": _tuple_text(c.table.names, c.raw_old),
                "error": cause.error,
                "message": cause.what,
                "window_start": start,
                "window_end": end,
                "quarantined_at": now,
            }
            for c in changes
        ],
        schema=quarantine_schema(),
    )


def held(lake: Lake) -> dict[str, Cause]:
    """The tables of ``lake`` in quarantine: with quarantined changes its state or changelog
    does not cover yet (no re-snapshot since), by the first such change's cause."""
    from airflow_pglogrepl.lake import delta

    uri = lake.paths.quarantine()
    if delta.open_table(uri) is None:
        return {}
    found = delta.read_table(uri).select(["table", "commit_lsn", "error", "message",
                                          "window_start"]).to_pylist()  # fmt: skip
    causes: dict[str, tuple[int, Cause]] = {}
    for row in found:
        table = str(row["table"])
        covered = lake.covered(table)
        if covered is not None and int(row["commit_lsn"]) < int(covered):
            continue  # a re-snapshot holds it
        first = causes.get(table)
        if first is None or int(row["commit_lsn"]) < first[0]:
            cause = Cause(str(row["error"]), str(row["message"]), str(row["window_start"]))
            causes[table] = (int(row["commit_lsn"]), cause)
    return {table: cause for table, (_, cause) in sorted(causes.items())}


def _tuple_text(names: Sequence[str], raw: Sequence[Any] | None) -> str | None:
    """A tuple as PostgreSQL sent it, as JSON: each column's text (a binary value as
    ``\\x<hex>``), null for NULL, ``{"unchanged_toast": true}`` for a TOASTed value the update
    did not change (and did not send)."""
    from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST, Binary

    if raw is None:
        return None
    values: dict[str, Any] = {}
    for name, value in zip(names, raw, strict=False):
        if value is None:
            values[name] = None
        elif value is UNCHANGED_TOAST:
            values[name] = {"unchanged_toast": True}
        elif isinstance(value, Binary):
            values[name] = "\\x" + bytes(value).hex()
        elif isinstance(value, bytes):
            values[name] = value.decode("utf-8", errors="backslashreplace")
        else:
            values[name] = str(value)
    return json.dumps(values, ensure_ascii=False)
