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
changelog has no gap, and no merge touches its state (which would then claim to hold changes it
does not), until a re-snapshot of the table releases it: the snapshot's state holds every change
before its point, every quarantined change among them (the slot never waits for them), and it
commits a *release* row (``op`` ``R`` at that point) once its state is committed. Only a
release ends a hold. The quarantine's rows stay as the record of what happened.
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
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.pgoutput.changes import Change

# The errors that are one table's: its changes go to the quarantine, the others go on.
TABLE_ERRORS = (SchemaChangedError, UnstorableValueError, UnsupportedColumnTypeError)
RELEASE = "R"  # the op of a release row: the table's changes before its commit_lsn are covered


def quarantine_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("table", pa.string()),  # str(TableRef): quoted where PostgreSQL needs it
            pa.field("commit_lsn", pa.int64()),
            pa.field("seq", pa.int64()),
            pa.field("xid", pa.int64()),
            pa.field("op", pa.string()),  # I, U, D, T; R: a release (``release``)
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


def rows(table: TableRef, changes: Sequence[Change], cause: Cause, start: str,
         end: str) -> pa.Table:  # fmt: skip
    """The quarantine rows of ``changes`` (one table's, of the window ``[start, end)``)."""
    import pyarrow as pa

    now = dt.datetime.now(dt.UTC)
    return pa.Table.from_pylist(
        [
            {
                "table": str(table),
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


def held(lake: Lake) -> dict[TableRef, Cause]:
    """The tables of ``lake`` in quarantine: with quarantined changes no release covers (no
    re-snapshot since), by the first such change's cause."""
    from airflow_pglogrepl.lake import delta

    uri = lake.paths.quarantine()
    if delta.open_table(uri) is None:
        return {}
    found = delta.read_table(uri).select(["table", "commit_lsn", "op", "error", "message",
                                          "window_start"]).to_pylist()  # fmt: skip
    released: dict[str, int] = {}
    for row in found:
        if row["op"] == RELEASE:
            table = str(row["table"])
            released[table] = max(released.get(table, 0), int(row["commit_lsn"]))
    causes: dict[str, tuple[int, Cause]] = {}
    for row in found:
        table, lsn = str(row["table"]), int(row["commit_lsn"])
        if row["op"] == RELEASE or lsn < released.get(table, 0):
            continue
        first = causes.get(table)
        if first is None or lsn < first[0]:
            cause = Cause(str(row["error"]), str(row["message"]), str(row["window_start"]))
            causes[table] = (lsn, cause)
    return {TableRef.parse(table): cause for table, (_, cause) in sorted(causes.items())}


def release(lake: Lake, table: TableRef, at: LSN) -> bool:
    """End the hold of ``table``: a release row at ``at``, below which its changes are covered
    (a re-snapshot's point, once its state is committed; or, for a table that can no longer be
    snapshotted, such as one dropped from the publication, the lake's position, knowing that
    its state then misses what the quarantine holds). True when it was held. Committed under
    an app transaction of its own, so the windows' quarantine commits are not affected."""
    import pyarrow as pa

    from airflow_pglogrepl.lake import delta

    if table not in held(lake):
        return False
    row: dict[str, Any] = dict.fromkeys(quarantine_schema().names)
    row.update(table=str(table), commit_lsn=int(at), seq=0, xid=0, op=RELEASE, error="",
               message=f"released at {at}", window_start=str(at), window_end=str(at),
               quarantined_at=dt.datetime.now(dt.UTC))  # fmt: skip
    rows = pa.Table.from_pylist([row], schema=quarantine_schema())
    uri = lake.paths.quarantine()
    app = f"{lake.app}#release"
    found = delta.txn_version(uri, app)
    written = delta.write_file(uri, rows, prefix="release")
    lake.check_writer()
    delta.commit_files(uri, quarantine_schema(), [written], app=app,
                       version=max(int(at), (found or 0) + 1), expected=found,
                       configuration=delta.KEEP_LOGS)  # fmt: skip
    return True


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
