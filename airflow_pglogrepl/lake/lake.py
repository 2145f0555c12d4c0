"""The window API the drain writes through, and why a crash at any point loses nothing.

A drain goes one way: slot -> fetch -> decode -> ``Lake.open_window(start)`` -> ``write`` batch
by batch -> ``commit(end)`` -> advance the slot. Every Delta commit made for the drain of a slot
carries the app transaction ``(app_id(slot), end LSN)``; in each table's log that version is the
exclusive LSN bound of what the table holds (every change whose transaction commits before it).

Order of durability in ``Window.commit``:

1. each touched ``changes/<table>`` commits the window's files (written during the window, and
   invisible until then) with version ``end``;
2. ``_pglogrepl/windows`` commits one row describing the window, with version ``end``: this is
   the commit point, and that table's version is the lake's position;
3. only then may the caller advance the slot to ``end``.

What a crash leaves, and what the next run (under the same writer lock) does with it:

- before 1 or between tables in 1: the lake's position is still ``start``, so is the slot; the
  window is drained again, and each table drops the rows it already holds (``_commit_lsn`` below
  its version) before writing, so no change is written twice and none is missed;
- between 2 and 3: the position is ahead of the slot; the drain advances the slot to it
  (PostgreSQL persists an advance only at the next checkpoint, so this also covers a server
  crash);
- Parquet files written before a crash and never committed are invisible to every reader;
  ``VACUUM`` removes them.

A slot ahead of the lake's position means someone else consumed changes: refused, never skipped.

Why ``_pglogrepl/windows`` exists at all, when every changelog table already records its own
version: a window in which no published table changed touches no table, yet the slot must
advance past it (or an idle publication pins WAL for ever), and "slot ahead of the lake" needs
the position of the lake as a whole. The table is plain Delta too, so its rows (one per window
and snapshot: bounds, counts, writer) are the lake's readable history.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import SchemaChangedError, UnsupportedColumnTypeError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.changelog import COMMIT_LSN
from airflow_pglogrepl.lake.layout import LakePaths, app_id, table_dir
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("airflow_pglogrepl.lake")

# Only the commit LSN gets file statistics: it is what merges select changelog files by.
CHANGES_CONFIG = {"delta.dataSkippingStatsColumns": COMMIT_LSN}
# Every this many versions the windows table's one-row files are compacted and its log
# checkpointed, so reading the lake's history and position stays cheap however long it runs.
COMPACT_EVERY = 100


def windows_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("kind", pa.string()),  # "window" or "snapshot"
            pa.field("slot", pa.string()),
            pa.field("start_lsn", pa.string()),
            pa.field("end_lsn", pa.string()),
            pa.field("transactions", pa.int64()),
            pa.field("changes", pa.int64()),
            pa.field("tables", pa.string()),  # JSON: table -> rows written
            pa.field("committed_at", pa.timestamp("us", tz="UTC")),
            pa.field("writer", pa.string()),  # host:pid
        ]
    )


class Lake:
    """One lake root as the drain of one slot sees it."""

    def __init__(self, root: str, slot: str) -> None:
        self.paths = LakePaths(root)
        self.slot = slot
        self.app = app_id(slot)
        self._versions: dict[str, LSN | None] = {}

    @property
    def root(self) -> str:
        return self.paths.root

    # -- where the lake stands ------------------------------------------------------------------

    def position(self) -> LSN | None:
        """The end of the last committed window (or snapshot); None for a lake never committed."""
        version = delta.txn_version(self.paths.windows(), self.app)
        return None if version is None else LSN(version)

    def changes_version(self, table: TableRef | str) -> LSN | None:
        """The exclusive LSN bound of what ``changes/<table>`` holds (None: nothing yet)."""
        name = table if isinstance(table, str) else table_dir(table)
        if name not in self._versions:
            version = delta.txn_version(self.paths.changes(name), self.app)
            self._versions[name] = None if version is None else LSN(version)
        return self._versions[name]

    def state_version(self, table: TableRef | str) -> LSN | None:
        """The exclusive LSN bound of what ``state/<table>`` includes (None: no state yet)."""
        version = delta.txn_version(self.paths.state(table), self.app)
        return None if version is None else LSN(version)

    def changes_tables(self) -> list[str]:
        return delta.list_tables(f"{self.root}/changes")

    def state_tables(self) -> list[str]:
        return delta.list_tables(f"{self.root}/state")

    def windows(self) -> list[dict[str, Any]]:
        """Every committed window and snapshot of this slot, oldest first."""
        if delta.open_table(self.paths.windows()) is None:
            return []
        rows = [r for r in delta.read_table(self.paths.windows()).to_pylist()
                if r["slot"] == self.slot]  # fmt: skip
        return sorted(rows, key=lambda r: LSN(r["end_lsn"]))

    # -- writing --------------------------------------------------------------------------------

    def open_window(self, start: LSN) -> Window:
        return Window(self, start)

    def record(self, *, kind: str, start: LSN, end: LSN, transactions: int = 0, changes: int = 0,
               tables: dict[str, int] | None = None) -> None:  # fmt: skip
        """Commit the row that makes ``[start, end)`` part of the lake: the commit point."""
        import pyarrow as pa

        row = {
            "kind": kind,
            "slot": self.slot,
            "start_lsn": str(start),
            "end_lsn": str(end),
            "transactions": transactions,
            "changes": changes,
            "tables": json.dumps(tables or {}, sort_keys=True),
            "committed_at": dt.datetime.now(dt.UTC),
            "writer": f"{socket.gethostname()}:{os.getpid()}",
        }
        rows = pa.Table.from_pylist([row], schema=windows_schema())
        uri = self.paths.windows()
        written = delta.write_file(uri, rows, prefix=f"{int(end):016X}")
        delta.commit_files(uri, rows.schema, [written], app=self.app, version=int(end),
                           name="pglogrepl windows")  # fmt: skip
        table = delta.open_table(uri)
        if table is not None and table.version() % COMPACT_EVERY == 0:
            # After the commit point: a crash here loses nothing, the next run compacts again.
            table.optimize.compact()
            table.create_checkpoint()

    def _committed_changes(self, name: str, end: LSN) -> None:
        self._versions[name] = end


@dataclass
class _Pending:
    schema: pa.Schema
    files: list[delta.DataFile] = field(default_factory=list)
    rows: int = 0


class Window:
    """The changes of ``[start, end)`` being written; nothing is visible before ``commit``."""

    def __init__(self, lake: Lake, start: LSN) -> None:
        self.lake = lake
        self.start = start
        self._pending: dict[str, _Pending] = {}
        self._prefix = f"{int(start):016X}"

    def write(self, table: TableRef, batch: pa.Table) -> int:
        """Write one batch of ``table``'s changelog rows; returns how many were new.

        Rows of transactions the table already holds (a window drained again after a crash
        between two tables' commits) are dropped here, so a replay never duplicates a change.
        """
        name = table_dir(table)
        held = self.lake.changes_version(name)
        if held is not None and held > self.start:
            import pyarrow.compute as pc

            batch = batch.filter(pc.greater_equal(batch.column(COMMIT_LSN), int(held)))
        if batch.num_rows == 0:
            return 0
        pending = self._pending.get(name)
        if pending is None:
            uri = self.lake.paths.changes(name)
            refused = delta.unsupported_columns(batch.schema)
            if refused:
                raise UnsupportedColumnTypeError(str(table), refused)
            difference = delta.schema_difference(uri, batch.schema)
            if difference is not None:  # checked before a file is written: nothing to undo
                raise SchemaChangedError(str(table), uri, difference)
            pending = self._pending[name] = _Pending(batch.schema)
        elif not pending.schema.equals(batch.schema):
            # A Relation message changed the table mid-window: one Delta commit takes one schema.
            raise SchemaChangedError(str(table), self.lake.paths.changes(name), "inside a window")
        pending.files.append(delta.write_file(self.lake.paths.changes(name), batch, self._prefix))
        pending.rows += batch.num_rows
        return int(batch.num_rows)

    def commit(self, end: LSN, *, transactions: int, changes: int) -> dict[str, int]:
        """Make the window part of the lake (see the module docstring for the order)."""
        if end < self.start:
            raise ValueError(f"window end {end} is before its start {self.start}")
        lake = self.lake
        for name, pending in self._pending.items():
            held = lake.changes_version(name)
            if held is not None and held >= end:
                continue  # committed by the run that crashed; its rows were filtered out anyway
            delta.commit_files(
                lake.paths.changes(name),
                pending.schema,
                pending.files,
                app=lake.app,
                version=int(end),
                configuration=CHANGES_CONFIG,
                name=name,
            )
            lake._committed_changes(name, end)
        counts = {name: p.rows for name, p in self._pending.items()}
        lake.record(kind="window", start=self.start, end=end, transactions=transactions,
                    changes=changes, tables=counts)  # fmt: skip
        return counts
