"""One app's transaction versions in a Delta table's log, read newest-first from the commit files.

"Which version of this table holds what the lake held at LSN P" is the newest version whose app
transaction is at or below P. Loading a ``DeltaTable`` per version to ask would replay the log
once per version; the commit files name the transaction in a ``txn`` action, so this reads them
newest-first, one small JSON file at a time, and stops as soon as the question is answered.

Versions without a ``txn`` action of the app (a schema change, a column's metadata, an OPTIMIZE)
belong to the transaction before them: Delta's snapshot carries the last one forward. Where log
cleanup removed older commit files, the oldest checkpoint from which the log is complete gives
the transaction at that version (through ``deltalake``, once); nothing older can be read at all.
Storage is reached through pyarrow's filesystems, so remote lakes work as local ones do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake.storage import delta_options, filesystem

_COMMIT = re.compile(r"(\d{20})\.json")
# classic, multi-part (``.checkpoint.0000000001.0000000002.parquet``), V2 (``.checkpoint.<uuid>``)
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint\..+")


class HistoryExpiredError(LakeError):
    """A table's log no longer reaches back to the position asked: log cleanup removed it."""


@dataclass(frozen=True)
class TxnVersion:
    """A table version and the app transaction version it carries (its LSN bound)."""

    version: int
    txn: int


class TxnLog:
    """The app transactions of ``app`` in the table at ``uri``, as far back as asked.

    The log is listed once, when this is made: versions committed later are not seen, so a
    reader that fixes its position first and then makes these sees a prefix of each log.
    """

    def __init__(self, uri: str, app: str) -> None:
        from pyarrow import fs

        self.uri = uri
        self.app = app
        self._fs, base = filesystem(uri)
        self._dir = f"{base}/_delta_log"
        try:
            infos = self._fs.get_file_info(fs.FileSelector(self._dir, allow_not_found=True))
        except FileNotFoundError:
            infos = []
        commits: set[int] = set()
        checkpoints: set[int] = set()
        for info in infos:
            if commit := _COMMIT.fullmatch(info.base_name):
                commits.add(int(commit.group(1)))
            elif checkpoint := _CHECKPOINT.fullmatch(info.base_name):
                checkpoints.add(int(checkpoint.group(1)))
        self.newest: int | None = max(commits) if commits else None
        # The commit files are read down to ``_stop``; below it, the checkpoint ``_base`` (None:
        # the log is complete from version 0) answers for the versions not read yet.
        self._stop = 0
        self._base: int | None = None
        if self.newest is not None:
            missing = self.newest
            while missing in commits:
                missing -= 1
            if missing >= 0:
                usable = [c for c in checkpoints if missing <= c <= self.newest]
                if not usable:
                    raise LakeError(
                        f"the Delta log of {uri} has no commit file for version {missing} and "
                        "no checkpoint after it: the table cannot be read"
                    )
                self._base = min(usable)
                self._stop = self._base + 1
        self._next = self.newest if self.newest is not None else -1  # the next file to read
        self._top = self._next  # the newest version not yet given a transaction
        self._found: list[tuple[int, int | None]] = []  # (newest version, txn), newest first
        self._complete = self.newest is None

    @property
    def exists(self) -> bool:
        """Whether there is a Delta table at ``uri`` (as listed)."""
        return self.newest is not None

    def latest(self) -> TxnVersion | None:
        """The newest version and its transaction (None: no table, or never written by app)."""
        return self.at_or_below((1 << 64) - 1)

    def at_or_below(self, bound: int) -> TxnVersion | None:
        """The newest version whose transaction is at or below ``bound``; None when no version
        carries one (no table, or the app had not written it yet at ``bound``).

        Raises ``HistoryExpiredError`` when the answer lies in versions log cleanup removed.
        """
        index = 0
        while True:
            while index < len(self._found):
                version, txn = self._found[index]
                if txn is not None and txn <= bound:
                    return TxnVersion(version, txn)
                index += 1
            if self._complete:
                break
            self._read_next()
        if self._base is not None and self._found[-1][1] is not None:
            oldest = self._found[-1][1]
            raise HistoryExpiredError(
                f"{self.uri} cannot be read at {bound}: its log starts at version {self._base} "
                f"(transaction {oldest}), older commit files were cleaned up"
            )
        return None

    def _read_next(self) -> None:
        if self._next < self._stop:
            if self._top >= max(self._stop - 1, 0):  # versions no commit file gave a txn
                self._found.append((self._top, self._at_base()))
            self._complete = True
            return
        txn = self._txn_of(self._next)
        if txn is not None:
            self._found.append((self._top, txn))
            self._top = self._next - 1
        self._next -= 1

    def _txn_of(self, version: int) -> int | None:
        with self._fs.open_input_stream(f"{self._dir}/{version:020d}.json") as stream:
            text: bytes = stream.read()
        found = None
        for line in text.splitlines():
            if b'"txn"' not in line:
                continue
            action = json.loads(line).get("txn")
            if isinstance(action, dict) and action.get("appId") == self.app:
                found = int(action["version"])
        return found

    def _at_base(self) -> int | None:
        """The transaction at the checkpoint version (None: the log is complete from 0, and
        the versions not read carry none)."""
        if self._base is None:
            return None
        from deltalake import DeltaTable

        version = DeltaTable(
            self.uri, version=self._base, storage_options=delta_options(self.uri)
        ).transaction_version(self.app)
        return None if version is None else int(version)
