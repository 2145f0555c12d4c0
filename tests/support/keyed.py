"""A keyed table's changes written through the lake's window API (no server, no JVM), and the
rows its state must hold after them: enough to build a lake whose merges insert, update and
delete by key, for tests of the lake's state tables and of what reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.lake.delta import read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

COLUMNS = [pa.field("id", pa.int64()), pa.field("v", pa.string())]
SCHEMA = pa.schema(
    [
        *cl.mark_keys(COLUMNS, ["id"]),
        pa.field(cl.OP, pa.string()).with_metadata(cl.identity_metadata("d")),
        pa.field(cl.COMMIT_LSN, pa.int64()),
        pa.field(cl.SEQ, pa.int64()),
        pa.field(cl.UNCHANGED, pa.list_(pa.string())),
        pa.field(cl.OLD, pa.struct(COLUMNS)),
    ]
)


class KeyedBatches:
    """Windows of changes to ``table`` (``id bigint`` key, ``v text``), committed one after the
    other from LSN 0x100; ``model`` is what the state must hold once they are merged."""

    def __init__(self, lake: Lake, table: TableRef) -> None:
        self.lake = lake
        self.table = table
        self.start = 0x100
        self.model: dict[int, str] = {}

    def commit(self, changes: list[tuple[str, int, str | None]]) -> LSN:
        rows = []
        for n, (op, key, value) in enumerate(changes):
            rows.append({"id": key, "v": value, cl.OP: op, cl.COMMIT_LSN: self.start + n + 1,
                         cl.SEQ: 0, cl.UNCHANGED: [], cl.OLD: None})  # fmt: skip
            if op == "D":
                self.model.pop(key, None)
            else:
                self.model[key] = str(value)
        end = LSN(self.start + len(changes) + 1)
        window = Window(self.lake, LSN(self.start))
        window.write(self.table, pa.Table.from_pylist(rows, schema=SCHEMA))
        window.commit(end, transactions=len(changes), changes=len(changes))
        self.start = int(end)
        return end

    def inserts(self, keys: range) -> LSN:
        return self.commit([("I", k, f"v{k}") for k in keys])

    def updates_and_deletes(self, keys: range, tag: str) -> LSN:
        """Updates of every other key in ``keys`` and deletes of every fifth one: rows in
        files that stay, which Spark's merge marks with deletion vectors when it may."""
        changes: list[tuple[str, int, str | None]] = []
        for k in keys:
            if k % 5 == 0:
                changes.append(("D", k, None))
            elif k % 2 == 0:
                changes.append(("U", k, f"{tag}{k}"))
        return self.commit(changes)

    def state(self) -> dict[int, str]:
        rows = read_table(self.lake.paths.state(self.table)).to_pylist()
        return {r["id"]: r["v"] for r in rows}

    def vectors_written(self) -> int:
        """How many files the state's log added with a deletion vector, in its whole history."""
        found = 0
        log = Path(self.lake.paths.state(self.table), "_delta_log")
        for entry in sorted(log.glob("*.json")):
            for line in entry.read_text().splitlines():
                found += bool(json.loads(line).get("add", {}).get("deletionVector"))
        return found
