"""The sink's layout and its commit protocol: what makes a drained window visible exactly once.

Layout under the sink root::

    changes/<schema>.<table>/<window>-<part>.parquet   committed changelog files
    state/<schema>.<table>/part-*.parquet              materialized current state
    _pglogrepl/commits/<end-lsn>.json                  one record per committed window
    _pglogrepl/staging/<window>/<schema>.<table>/      a window being written (invisible)

Parquet readers skip names starting with ``_``, so staging is never read as data. A window
becomes visible in three idempotent steps: Spark writes its files to staging; the commit record
is written atomically (this is the commit point: durable before anything else happens); the
files are moved into ``changes/``. Only after that may the slot advance. On restart,
``recover()`` finishes the moves of committed windows and deletes staging that has no record:
after any crash, ``changes/`` holds whole committed windows only, each once.

An initial snapshot (``kind="snapshot"``, ``spark/snapshot.py``) is committed the same way at the
slot's consistent point, with ``start_lsn == end_lsn`` and no changelog files: its staged
directories replace ``state/<schema>.<table>/`` whole and each table's state record
(``_pglogrepl/state/<table>.json``) is set to the consistent point, idempotently, so a crash
before the record leaves ``state/`` untouched and one after it is finished by ``recover()``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.storage import Storage
from airflow_pglogrepl.tables import TableRef

META = "_pglogrepl"
_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


def table_dir(table: TableRef) -> str:
    """``schema.table`` for a directory name; other characters escaped (``%XX``) so any name,
    including ones with ``/``, ``.`` or ``=``, maps to one safe, reversible directory."""
    return f"{_escape(table.schema)}.{_escape(table.name)}"


def table_from_dir(name: str) -> TableRef:
    """The inverse of ``table_dir``."""
    schema, _, table = name.partition(".")
    return TableRef(unquote(schema), unquote(table))


def _escape(part: str) -> str:
    text = "".join(ch if ch in _SAFE else quote(ch, safe="") for ch in part).replace(".", "%2E")
    # Parquet readers skip names starting with "_" (or "."): never start a directory that way.
    return "%5F" + text[1:] if text.startswith("_") else text


def window_id(end: LSN) -> str:
    """A window's name: its end LSN as 16 hex digits, so names sort in commit order."""
    return f"{int(end):016X}"


@dataclass(frozen=True)
class CommitRecord:
    """A committed window: its LSN bounds, counts, and the files it made visible per table."""

    kind: str  # "window" (a drained LSN window) or "snapshot" (an initial copy)
    slot: str
    start_lsn: str
    end_lsn: str
    transactions: int
    changes: int
    files: dict[str, list[str]] = field(default_factory=dict)  # table dir -> file names
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)  # table dir -> schema info

    @property
    def end(self) -> LSN:
        return LSN(self.end_lsn)

    @property
    def window(self) -> str:
        return window_id(self.end)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> CommitRecord:
        return cls(**json.loads(text))


class Sink:
    """The commit protocol over a ``Storage``; paths are strings under ``root``."""

    def __init__(self, root: str, storage: Storage) -> None:
        self.root = root.rstrip("/")
        self.storage = storage

    # -- paths ------------------------------------------------------------------------------

    def changes_dir(self, table: TableRef | str) -> str:
        name = table if isinstance(table, str) else table_dir(table)
        return self.storage.join(self.root, "changes", name)

    def state_dir(self, table: TableRef | str) -> str:
        name = table if isinstance(table, str) else table_dir(table)
        return self.storage.join(self.root, "state", name)

    def staging_dir(self, window: str, table: TableRef | str | None = None) -> str:
        base = self.storage.join(self.root, META, "staging", window)
        if table is None:
            return base
        return self.storage.join(base, table if isinstance(table, str) else table_dir(table))

    def _commits_dir(self) -> str:
        return self.storage.join(self.root, META, "commits")

    def state_record_path(self, table: TableRef | str) -> str:
        """Where a table's state record (the LSN its ``state/`` includes) lives."""
        name = table if isinstance(table, str) else table_dir(table)
        return self.storage.join(self.root, META, "state", f"{name}.json")

    # -- reading ----------------------------------------------------------------------------

    def commits(self) -> list[CommitRecord]:
        """Every commit record, in LSN order."""
        directory = self._commits_dir()
        names = [n for n in self.storage.list_names(directory) if n.endswith(".json")]
        return [
            CommitRecord.from_json(self.storage.read_text(self.storage.join(directory, n)))
            for n in sorted(names)
        ]

    def last_commit(self) -> CommitRecord | None:
        """The newest commit record, or ``None`` for an empty sink."""
        records = self.commits()
        return records[-1] if records else None

    # -- the protocol -------------------------------------------------------------------------

    def staged_files(self, window: str) -> dict[str, list[str]]:
        """Parquet part files Spark wrote for a window, per table directory."""
        base = self.staging_dir(window)
        files: dict[str, list[str]] = {}
        for table in self.storage.list_names(base):
            parts = [
                n for n in self.storage.list_names(self.storage.join(base, table))
                if n.endswith(".parquet")
            ]  # fmt: skip
            if parts:
                files[table] = parts
        return files

    def commit(self, record: CommitRecord) -> None:
        """Make a staged window visible: durable record first, then the idempotent moves."""
        path = self.storage.join(self._commits_dir(), f"{record.window}.json")
        self.storage.write_text_atomic(path, record.to_json())
        self._publish(record)

    def _publish(self, record: CommitRecord) -> None:
        if record.kind == "snapshot":
            self._publish_snapshot(record)
            return
        window = record.window
        for table, names in record.files.items():
            for name in names:
                src = self.storage.join(self.staging_dir(window, table), name)
                dst = self.storage.join(self.changes_dir(table), f"{window}-{name}")
                if self.storage.exists(src):
                    self.storage.move(src, dst)
                elif not self.storage.exists(dst):
                    raise RuntimeError(
                        f"sink {self.root}: window {record.start_lsn}..{record.end_lsn} is "
                        f"committed but its file {table}/{name} is neither staged nor published;"
                        f" the sink was modified by hand. Restore the file or re-create the sink"
                    )
        self.storage.delete(self.staging_dir(window))

    def _publish_snapshot(self, record: CommitRecord) -> None:
        """Swap each staged table directory in as ``state/``, then point its state record at
        the snapshot. Every step can be repeated; a state record already past the snapshot
        (merged further) is never moved back."""
        window = record.window
        for table in record.tables:
            staged = self.staging_dir(window, table)
            target = self.state_dir(table)
            if self.storage.exists(staged):
                self.storage.delete(target)
                self.storage.move(staged, target)
            elif not self.storage.exists(target):
                raise RuntimeError(
                    f"sink {self.root}: the snapshot at {record.end_lsn} is committed but the "
                    f"state of {table} is neither staged nor published; the sink was modified "
                    f"by hand. Re-create the sink from a new initial snapshot"
                )
            path = self.state_record_path(table)
            current = self.storage.read_text(path) if self.storage.exists(path) else None
            if current is None or LSN(json.loads(current)["lsn"]) < record.end:
                self.storage.write_text_atomic(
                    path, json.dumps({"lsn": record.end_lsn, "next": None})
                )
        self.storage.delete(self.staging_dir(window))

    def recover(self) -> CommitRecord | None:
        """Finish committed windows, drop uncommitted staging; return the last commit."""
        records = self.commits()
        committed = {record.window for record in records}
        for record in records:
            if self.storage.exists(self.staging_dir(record.window)):
                self._publish(record)
        staging = self.storage.join(self.root, META, "staging")
        for window in self.storage.list_names(staging):
            if window not in committed:
                self.storage.delete(self.storage.join(staging, window))
        return records[-1] if records else None
