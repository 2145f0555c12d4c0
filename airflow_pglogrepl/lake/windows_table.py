"""The rows of ``_pglogrepl/windows``: the lake's commit points, and who the lake belongs to.

Every window and snapshot the lake commits is one row of that table (``Lake.record``: the
commit point), and every claim of the lake by a slot is one too (``Lake.claim``). Claims live in
the same table as the commit points so that a claim is a Delta commit like every other,
compare-and-set on its own app transaction (``LAKE_APP``), and so that the claims a run checks
and the version its claim expects are read from one Delta version. This module says what those
rows are: their schema, how a window's row and a claim's row are made, and what the rows say
of the lake's owner (``identity_of``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lsn import LSN

if TYPE_CHECKING:
    import pyarrow as pa

CLAIM = "claim"  # the kind of a windows row that records whose lake it is (``Lake.claim``)
CLAIM_KEY = "claim_version"  # in a claim's JSON: its version of ``LAKE_APP``, newest wins
# In a claim's JSON: whether the lake creates its state tables with deletion vectors (a lake
# whose claims do not say: with them, as every lake did before the option)
STATE_VECTORS = "state_deletion_vectors"


def windows_schema() -> pa.Schema:
    """The columns of every row, windows, snapshots and claims alike: one schema, so that one
    read of the table gives the lake's history and its owner together."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("kind", pa.string()),  # "window", "snapshot" or "claim" (Lake.claim)
            pa.field("slot", pa.string()),
            pa.field("start_lsn", pa.string()),
            pa.field("end_lsn", pa.string()),
            pa.field("transactions", pa.int64()),
            pa.field("changes", pa.int64()),
            pa.field("tables", pa.string()),  # JSON: table -> rows written
            pa.field("committed_at", pa.timestamp("us", tz="UTC")),
            pa.field("writer", pa.string()),  # host:pid
            # JSON: system_identifier, timeline, database of the source (``source_identity``);
            # in a claim, the lake's identity (``Lake.claim``)
            pa.field("source", pa.string()),
        ]
    )


def window_row(*, kind: str, slot: str, start: LSN, end: LSN, transactions: int, changes: int,
               tables: dict[str, int] | None,
               source: dict[str, object] | None) -> dict[str, Any]:  # fmt: skip
    """The row that makes ``[start, end)`` part of the lake (``Lake.record``), stamped with the
    process that wrote it and the identity of the source it came from."""
    return {
        "kind": kind,
        "slot": slot,
        "start_lsn": str(start),
        "end_lsn": str(end),
        "transactions": transactions,
        "changes": changes,
        "tables": json.dumps(tables or {}, sort_keys=True),
        "committed_at": dt.datetime.now(dt.UTC),
        "writer": _writer(),
        "source": json.dumps(source, sort_keys=True) if source else None,
    }


def claim_row(slot: str, identity: dict[str, Any], version: int) -> dict[str, Any]:
    """The row of a claim (``Lake.claim``): the identity it records, with its ``version`` of
    ``LAKE_APP`` (``CLAIM_KEY``), by which the newest claim wins."""
    return {**_empty_row(), "kind": CLAIM, "slot": slot,
            "committed_at": dt.datetime.now(dt.UTC), "writer": _writer(),
            "source": json.dumps({**identity, CLAIM_KEY: version}, sort_keys=True)}  # fmt: skip


def identity_of(rows: list[dict[str, Any]], slot: str) -> dict[str, Any] | None:
    """``Lake.identity`` of the windows table's ``rows``, seen by the drain of ``slot``."""
    claims = [json.loads(r["source"]) for r in rows if r["kind"] == CLAIM]
    if claims:  # the newest: claims carry versions 1, 2, ... of their app (``LAKE_APP``)
        newest: dict[str, Any] = max(claims, key=lambda c: int(c[CLAIM_KEY]))
        return {k: v for k, v in newest.items() if k != CLAIM_KEY}
    committed = sorted((r for r in rows if r["end_lsn"]), key=lambda r: LSN(r["end_lsn"]))
    if not committed:
        return None
    slots = {r["slot"] for r in committed}
    # A lake from before claims that several slots wrote: the slot asking keeps it if it wrote
    # there (its first claim then makes it the only one), else the last writer's.
    owner = slot if slot in slots else committed[-1]["slot"]
    mine = [r for r in committed if r["slot"] == owner]
    first, last = mine[0], mine[-1]
    source = json.loads(last["source"]) if last.get("source") else {}
    return {
        "slot": owner,
        "system_identifier": source.get("system_identifier"),
        "database": source.get("database"),
        "database_oid": source.get("database_oid"),
        "timeline": source.get("timeline"),
        "server_version_num": source.get("server_version_num"),
        "publications": None,
        "created_at": str(first["committed_at"]),
        "began_with": first["kind"],
    }


def _writer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _empty_row() -> dict[str, Any]:
    return dict.fromkeys(windows_schema().names)
