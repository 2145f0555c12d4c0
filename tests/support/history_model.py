"""A history's model: versions replayed one change at a time, and random changes to replay."""

from __future__ import annotations

import datetime
import random
from typing import Any

import pyarrow as pa

from airflow_pglogrepl.changelog.history_columns import (
    ENDED_BY,
    IS_CURRENT,
    VALID_FROM,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO,
    VALID_TO_LSN,
    VALID_TO_SEQ,
    history_schema,
)
from airflow_pglogrepl.merge.history_copies import copies_versions
from airflow_pglogrepl.merge.history_versions import Versions, versions

COLUMNS = ["id", "v", "big"]
TABLE = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.int64()),
                   pa.field("big", pa.string())])  # fmt: skip
TYPES = history_schema(TABLE)
STAMP = pa.timestamp("us", tz="UTC")
CHANGES = pa.schema([
    *TABLE,
    pa.field("_op", pa.string()),
    pa.field("_commit_lsn", pa.int64()),
    pa.field("_seq", pa.int64()),
    pa.field("_commit_ts", STAMP),
    pa.field("_unchanged", pa.list_(pa.string())),
    pa.field("_old", pa.struct(list(TABLE))),
])  # fmt: skip
Version = dict[str, Any]


def stamp(lsn: int) -> datetime.datetime:
    return datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=lsn)


def change(op: str, lsn: int, seq: int, id: int | None = None, v: int | None = None,
           big: str | None = None, *, unchanged: tuple[str, ...] = (),
           old: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"id": id, "v": v, "big": big, "_op": op, "_commit_lsn": lsn, "_seq": seq,
            "_commit_ts": stamp(lsn), "_unchanged": list(unchanged), "_old": old}  # fmt: skip


class History:
    """A history as a list of versions, changed as the Delta MERGE would change it."""

    def __init__(self, keyed: bool) -> None:
        self.rows: list[Version] = []
        self.keyed = keyed

    def current(self, wanted: pa.Table | None) -> pa.Table:
        rows = [r for r in self.rows if r[IS_CURRENT]]
        if wanted is not None and self.keyed:
            ids = set(wanted.column("id").to_pylist())
            rows = [r for r in rows if r["id"] in ids]
        return pa.Table.from_pylist(rows, schema=TYPES)

    def apply(self, made: Versions) -> None:
        for end in made.closed.to_pylist():
            found = [r for r in self.rows if r[IS_CURRENT]
                     and all(r[m] == end[m] for m in made.match)]  # fmt: skip
            assert len(found) <= 1, (end, found)  # a MERGE's match: none, or the one
            for row in found:
                row.update({k: end[k] for k in (VALID_TO_LSN, VALID_TO_SEQ, VALID_TO,
                                                IS_CURRENT, ENDED_BY)})  # fmt: skip
        self.rows += made.opened.to_pylist()

    def merge(self, batch: list[dict[str, Any]], *, keys: list[str], full: bool = False) -> int:
        # in no particular order, as a changelog's files are read
        rows = pa.Table.from_pylist(batch[::-1], schema=CHANGES)
        if full:
            made = copies_versions(rows, COLUMNS, self.current, TYPES)
        else:
            made = versions(rows, COLUMNS, keys, prior=self.current, types=TYPES)
        self.apply(made)
        return made.orphans


def model(changes: list[dict[str, Any]], *, keyed: bool, full: bool,
          start: list[Version] | None = None) -> list[Version]:  # fmt: skip
    """The history of ``changes`` replayed one at a time, in commit order."""
    rows: list[Version] = [dict(r) for r in start or []]
    current: list[int] = [i for i, r in enumerate(rows) if r[IS_CURRENT]]

    def end(index: int, c: dict[str, Any], why: str) -> None:
        rows[index].update({VALID_TO_LSN: c["_commit_lsn"], VALID_TO_SEQ: c["_seq"],
                            VALID_TO: c["_commit_ts"], IS_CURRENT: False,
                            ENDED_BY: why})  # fmt: skip
        current.remove(index)

    def find(values: dict[str, Any]) -> int | None:
        names = ["id"] if keyed else COLUMNS
        for index in current:  # oldest first
            if all(rows[index][n] == values[n] for n in names):
                return index
        return None

    for c in sorted(changes, key=lambda c: (c["_commit_lsn"], c["_seq"])):
        op = c["_op"]
        if op == "T":
            for index in list(current):
                end(index, c, "truncate")
            continue
        values = {n: c[n] for n in COLUMNS}
        if op in ("U", "D"):
            old = c["_old"] if op == "U" and c["_old"] is not None else values
            index = find(old if full else {"id": old["id"]})
            if index is not None:
                why = (
                    "delete"
                    if op == "D"
                    else ("key_change" if keyed and old["id"] != c["id"] else "update")
                )
                end(index, c, why)
            for name in c["_unchanged"]:
                values[name] = rows[index][name] if index is not None else None
        if op in ("I", "U"):
            rows.append({**values, VALID_FROM_LSN: c["_commit_lsn"], VALID_FROM_SEQ: c["_seq"],
                         VALID_FROM: c["_commit_ts"], VALID_TO_LSN: None, VALID_TO_SEQ: None,
                         VALID_TO: None, IS_CURRENT: True, ENDED_BY: None})  # fmt: skip
            current.append(len(rows) - 1)
    return rows


def ordered(rows: list[Version]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r[f.name] for f in TYPES) for r in rows), key=repr)


def random_changes(rng: random.Random, *, keyed: bool, full: bool,
                   transactions: int) -> list[dict[str, Any]]:  # fmt: skip
    """Transactions of one to three changes: inserts, updates (some keeping the TOASTed column,
    some moving the row to another key), deletes, a rare TRUNCATE; every change valid against
    the rows it finds."""
    rows: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    lsn = 0x1000
    for _ in range(transactions):
        lsn += 0x40
        for seq in range(rng.randint(1, 3)):
            roll = rng.random()
            if roll < 0.03:
                out.append(change("T", lsn, seq))
                rows.clear()
                continue
            if not rows or roll < 0.35:
                ident = rng.randrange(1, 9) if not full else rng.randrange(1, 3)
                if keyed and any(r["id"] == ident for r in rows):
                    continue
                row = {"id": ident, "v": rng.randrange(3) if full else rng.randrange(100),
                       "big": rng.choice(["x" * 30, None, "y"])}  # fmt: skip
                out.append(change("I", lsn, seq, **row))
                rows.append(row)
                continue
            row = rng.choice(rows)
            if roll < 0.8:
                new = dict(row, v=rng.randrange(3) if full else rng.randrange(100))
                unchanged: tuple[str, ...] = ()
                if rng.random() < 0.4:
                    unchanged = ("big",)
                if keyed and rng.random() < 0.25:
                    free = [i for i in range(1, 9) if all(r["id"] != i for r in rows)]
                    if free:
                        new["id"] = rng.choice(free)
                sent = dict(new, big=None) if unchanged else new
                old = (dict(row) if full else {"id": row["id"], "v": None, "big": None}
                       if new["id"] != row["id"] else None)  # fmt: skip
                out.append(change("U", lsn, seq, **sent, unchanged=unchanged, old=old))
                rows[rows.index(row)] = new
            else:
                gone = dict(row) if full else {"id": row["id"], "v": None, "big": None}
                out.append(change("D", lsn, seq, **gone))
                rows.remove(row)
    return out


def batches(rng: random.Random, changes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The changes cut into batches at transaction boundaries (a window holds whole ones)."""
    lsns = sorted({c["_commit_lsn"] for c in changes})
    cuts = sorted(rng.sample(lsns, min(3, len(lsns))))
    out, low = [], -1
    for cut in [*cuts, lsns[-1] + 1]:
        out.append([c for c in changes if low <= c["_commit_lsn"] < cut])
        low = cut
    return [b for b in out if b]
