"""What each table of the lake was at the last look, so that a run reads only the tables that
moved since.

Why: deciding which tables a run must merge, and which the upkeep must maintain, read every
table's Delta log on every run. On an object store each read of a log is a listing and a GET per
commit since its checkpoint (an open of a table of 12 versions: 26 requests), so a run over 40
tables with changes in 2 made about 9,700 requests, 10 times the time of the same run on a
local lake.

The record (``_pglogrepl/versions.json``, one small JSON object) notes per table the Delta
version last read and what was read at that version: the lake app's transaction version (the
LSN a changelog or a state holds up to), and what the upkeep left (when, and the table's own
``delta.deletedFileRetentionDuration``). It is a cache, never the truth:

- an entry is used only while its table has no commit after its version: the commit file of
  that version is the one noted (its size and modification time) and the next one is not there
  (two HEAD requests). Delta writes each version as a new commit file, and log cleanup removes
  the oldest first, so a table that moved, whose log was cleaned past the noted version, or
  that was removed and written again from version 0, is read again whatever wrote it (a drain,
  a merge, the upkeep, Spark, another tool). A store that fails to answer a check counts as a
  move;
- what an entry says was read from the same Delta version (one open table), so an entry whose
  version holds is exact;
- a record that is missing, unreadable or of another app is no record: every table is read.
  Writers hold the lake's writer lock; a lost update only makes the next run read more.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.layout import is_local, local_path
from airflow_pglogrepl.lake.storage import commit_fingerprint, filesystem

log = logging.getLogger("airflow_pglogrepl.lake")

RECORD = "_pglogrepl/versions.json"
CHECKS_AT_ONCE = 16  # HEAD requests in flight when checking many tables on an object store


class SeenVersions:
    """The record of one lake root (``RECORD``), read once; ``note`` and ``save`` change it.

    Tables are named by their path under the root (``changes/<dir>``, ``state/<dir>``,
    ``_pglogrepl/windows``)."""

    def __init__(self, root: str, app: str) -> None:
        self.root = root.rstrip("/")
        self.app = app
        self._entries: dict[str, dict[str, Any]] = {}
        self._dirty = False
        self._still: dict[tuple[str, int], bool] = {}
        self._system, self._base = filesystem(self.root)
        self._load()

    @property
    def uri(self) -> str:
        return f"{self.root}/{RECORD}"

    def _load(self) -> None:
        system, path = filesystem(self.uri)
        try:
            with system.open_input_stream(path) as stream:
                document = json.loads(stream.read())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:  # torn or foreign: read every table again
            log.warning("ignoring %s (%s: %s); every table's log is read", self.uri,
                        type(exc).__name__, exc)  # fmt: skip
            return
        if not isinstance(document, dict) or document.get("app") != self.app:
            return
        tables = document.get("tables")
        if isinstance(tables, dict):
            self._entries = {
                k: v for k, v in tables.items()
                if isinstance(v, dict) and isinstance(v.get("version"), int)
            }  # fmt: skip

    def names(self, parent: str) -> set[str]:
        """The tables under ``parent`` (``changes`` or ``state``) the record knows: each was a
        Delta table when noted, and tables are never deleted."""
        prefix = f"{parent}/"
        return {name.removeprefix(prefix) for name in self._entries if name.startswith(prefix)}

    def knows(self, name: str) -> bool:
        """Whether ``name`` was noted (it was a Delta table then, and tables are never
        deleted)."""
        return name in self._entries

    def noted(self, name: str) -> dict[str, Any] | None:
        """What was noted of ``name``, whether or not its table moved since."""
        return self._entries.get(name)

    def entry(self, name: str) -> dict[str, Any] | None:
        """What was noted of ``name``, if its table has not moved since (else None)."""
        found = self._entries.get(name)
        if found is None or not self.still([name])[name]:
            return None
        return found

    def still(self, names: Iterable[str]) -> dict[str, bool]:
        """For each of ``names``: whether its table is still at the noted version (False for a
        table not noted). Checked in parallel on an object store, once per run and version."""
        wanted = [n for n in dict.fromkeys(names) if n in self._entries]
        todo = [n for n in wanted if (n, self._entries[n]["version"]) not in self._still]
        if todo:
            workers = 1 if is_local(self.root) else min(CHECKS_AT_ONCE, len(todo))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                found = pool.map(lambda n: self._unmoved(n, self._entries[n]["version"]), todo)
                for name, verdict in zip(todo, found, strict=True):
                    self._still[(name, self._entries[name]["version"])] = verdict
        return {n: n in self._entries and self._still[(n, self._entries[n]["version"])]
                for n in names}  # fmt: skip

    def _unmoved(self, name: str, version: int) -> bool:
        """Whether the commit file of ``version`` is the one noted (same size and time: a table
        written again from scratch reaches the same version numbers with other files) and no
        commit follows it. A store that fails to answer counts as moved: the log is read."""
        try:
            return self._fingerprint(name, version) == self._entries[name].get("commit") and (
                not _exists(self._system, self._commit(name, version + 1))
            )
        except OSError as exc:
            log.debug("could not check %s/%s (%s: %s); its log is read", self.root, name,
                      type(exc).__name__, exc)  # fmt: skip
            return False

    def _commit(self, name: str, version: int) -> str:
        return f"{self._base}/{name}/_delta_log/{version:020d}.json"

    def _fingerprint(self, name: str, version: int) -> list[int] | None:
        """The size and modification time of the commit file of ``version`` (None: none)."""
        return commit_fingerprint(self._system, f"{self._base}/{name}", version)

    def tables(self, parent: str) -> list[str]:
        """The tables under ``parent`` (``changes`` or ``state``), as ``delta.list_tables``
        lists them: one listing, and an open only of a folder the record does not know."""
        return delta.list_tables(f"{self.root}/{parent}", self.names(parent))

    def lsn(self, name: str) -> int | None:
        """The app's transaction version in ``name`` (the LSN a changelog or a state holds up
        to; None: none, or no table): noted, or read from the table's log and noted."""
        found = self.entry(name)
        if found is not None and "lsn" in found:
            return None if found["lsn"] is None else int(found["lsn"])
        table = delta.open_table(f"{self.root}/{name}")
        if table is None:
            self.forget(name)
            return None
        version = table.transaction_version(self.app)
        self.note(name, int(table.version()), lsn=None if version is None else int(version))
        return None if version is None else int(version)

    def forget(self, name: str) -> None:
        """Drop what was noted of ``name`` (no table there now)."""
        if self._entries.pop(name, None) is not None:
            self._dirty = True

    def note(self, name: str, version: int, **facts: Any) -> None:
        """Note what was read of ``name`` at ``version``: ``facts`` join what was noted of the
        same version, and replace what was noted of another. The commit file of ``version`` is
        fingerprinted (one HEAD); a table whose file cannot be is not noted."""
        current = self._entries.get(name)
        if current and current["version"] == version and "commit" in current:
            entry = dict(current)
        else:
            try:
                commit = self._fingerprint(name, version)
            except OSError:
                commit = None
            if commit is None:
                self.forget(name)
                return
            entry = {"commit": commit}
        entry.update(facts, version=version)
        if entry != current:
            self._entries[name] = entry
            self._still[(name, version)] = True  # it was just read at that version
            self._dirty = True

    def save(self) -> None:
        """Write the record if anything was noted. A failure is logged, not raised: the record
        only saves reads, and the next run reads what it cannot find."""
        if not self._dirty:
            return
        document = json.dumps({"app": self.app, "tables": self._entries}, sort_keys=True)
        try:
            _write(self.uri, document.encode())
        except OSError as exc:
            log.warning("could not write %s (%s: %s); the next run reads every table's log",
                        self.uri, type(exc).__name__, exc)  # fmt: skip
            return
        self._dirty = False


def _exists(system: Any, path: str) -> bool:
    """Whether the file at ``path`` exists: one HEAD request on an object store (a missing key
    is not also listed as a folder, as ``get_file_info`` would)."""
    try:
        system.open_input_file(path).close()
    except FileNotFoundError:
        return False
    return True


def _write(uri: str, data: bytes) -> None:
    """The record's new content, whole: renamed into place on a local disk, one PUT on an
    object store (never seen half written either way)."""
    if is_local(uri):
        path = local_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.tmp", "wb") as out:
            out.write(data)
        os.replace(f"{path}.tmp", path)
        return
    system, path = filesystem(uri)
    with system.open_output_stream(path) as out:
        out.write(data)
