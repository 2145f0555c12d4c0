"""A run's opened Delta tables: each table's log read once, then brought up to date.

Opening a Delta table reads its newest checkpoint and every commit after it. On an object store
that is one listing and about fifteen GETs (a checkpoint is read in ranges), some 40 ms on the
tests' S3 server; a drain run opened the windows table nineteen times in five windows, and the
merge and the upkeep each open a table several times. A kept table is brought up to date with
``update_incremental`` instead: a HEAD, a listing, and a GET per newer commit.

Why the result is what a fresh open would read:

- inside ``reused()`` the process holds the lake's writer lock, so no other writer commits, and
  the commits this process makes (delta-rs, Spark, the log entries ``lake.durability`` writes)
  are newer commits, which the update reads;
- the way this process takes a table away, ``staging.remove``, says so (``forget``, before and
  after the removal), and every scope drops what was removed before its next open;
- a table taken away by anyone else (a person, another tool, during the run) is caught before
  it is used: the commit file of the kept version must still be the one read (size and time; a
  table written again from scratch reaches the same versions with other files), or the table
  is opened afresh, with a warning. A table whose update fails is opened afresh too.

A scope belongs to the thread that entered it. A thread started inside it does not use it, even
where the thread inherits the context (free-threaded Python from 3.14), so no table object is
shared between threads. A thread that works for the scope (the drain's write thread) enters,
on each call, the ``Opened`` its scope keeps for it (``for_another_thread``). Callers share an
object within one thread: what they keep of it across another open is an ``int`` of its
version, never the object as a snapshot.

What is kept is bounded: at most ``KEPT`` tables and ``KEPT_FILES`` live files in all (a
table's file list is most of its memory, about 330 bytes a file), the least recently opened
dropped first; a bigger table is opened afresh each time, as before.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.lake.storage import commit_fingerprint, filesystem

__all__ = ["Opened", "at_version", "for_another_thread", "forget", "newest", "removing", "reused"]

log = logging.getLogger(__name__)

KEPT = 64
KEPT_FILES = 100_000

_lock = threading.Lock()
_removed: deque[str] = deque(maxlen=1024)  # the newest removals in this process
_removals = 0  # all removals in this process: a scope behind by more than the deque drops all


@dataclass
class _Kept:
    table: Any
    files: int
    system: Any
    path: str
    version: int  # the version last read from the log (a commit through the object moves it on)
    commit: list[int] | None  # the fingerprint of that version's commit file


class Opened:
    """The tables one run, or one thread of it, keeps open."""

    def __init__(self) -> None:
        self.tables: OrderedDict[str, _Kept] = OrderedDict()
        self.other_thread: Opened | None = None  # (``for_another_thread``)
        with _lock:
            self._seen = _removals

    @property
    def files(self) -> int:
        return sum(kept.files for kept in self.tables.values())

    def catch_up(self) -> None:
        """Drop the tables removed since the last look (by any thread)."""
        with _lock:
            missed, self._seen = _removals - self._seen, _removals
            removed = list(_removed)[len(_removed) - missed :] if missed <= len(_removed) else None
        if removed is None:
            self.tables.clear()
            return
        for uri in removed:
            inside = uri.rstrip("/") + "/"
            for key in [k for k in self.tables if k == uri or k.startswith(inside)]:
                del self.tables[key]

    def keep(self, uri: str, table: Any) -> None:
        """Keep ``table`` (just opened at ``uri``), within the bounds."""
        try:
            files = len(table.file_uris())
            system, path = filesystem(uri)
            version = int(table.version())
            commit = commit_fingerprint(system, path, version)
        except OSError as exc:  # (not kept: every open reads the log, as without a scope)
            log.debug("%s not kept open (%s)", uri, exc)
            return
        if files > KEPT_FILES:
            return
        self.tables[uri] = _Kept(table, files, system, path, version, commit)
        while len(self.tables) > KEPT or self.files > KEPT_FILES:
            self.tables.popitem(last=False)

    def reuse(self, uri: str) -> Any | None:
        """The table kept for ``uri``, brought up to date (None: none, or not the same table)."""
        kept = self.tables.pop(uri, None)
        if kept is None:
            return None
        try:
            if commit_fingerprint(kept.system, kept.path, kept.version) != kept.commit:
                log.warning("%s changed under the run (its commit file of version %s is not the "
                            "one read): opened afresh", uri, kept.version)  # fmt: skip
                return None
            kept.table.update_incremental()
            if int(kept.table.version()) != kept.version:
                kept.version = int(kept.table.version())
                kept.commit = commit_fingerprint(kept.system, kept.path, kept.version)
        except Exception as exc:  # (its log changed under it: read it as a first open would)
            log.warning("%s opened afresh: bringing it up to date failed (%s)", uri, exc)
            return None
        self.tables[uri] = kept
        return kept.table


# The scope of the current context, and the thread that entered it
_RUN: ContextVar[tuple[Opened, int] | None] = ContextVar("pglogrepl_opened_tables", default=None)


def _current() -> Opened | None:
    run = _RUN.get()
    if run is None or run[1] != threading.get_ident():
        return None  # (a scope this thread inherited, not entered: not its own)
    return run[0]


@contextmanager
def reused(opened: Opened | None = None) -> Iterator[None]:
    """Within the block, ``newest`` keeps each table it opens (in ``opened``, default a new
    set) and updates it on the next open. A block inside another without ``opened`` uses the
    outer one's tables. Also a decorator: the function's call is the block."""
    if opened is None and _current() is not None:
        yield
        return
    entered = opened if opened is not None else Opened()
    token = _RUN.set((entered, threading.get_ident()))
    try:
        yield
    finally:
        _RUN.reset(token)


def for_another_thread() -> Opened | None:
    """The tables a thread working for the current scope keeps, for it to enter with
    ``reused`` on each call (None: no scope here). They live as long as the scope does."""
    opened = _current()
    if opened is None:
        return None
    if opened.other_thread is None:
        opened.other_thread = Opened()
    return opened.other_thread


def newest(uri: str, load: Callable[[str], Any | None]) -> Any | None:
    """The table at ``uri`` at its newest version: the one opened earlier in this scope,
    brought up to date, or ``load(uri)`` (None: no table there; not kept)."""
    opened = _current()
    if opened is None:
        return load(uri)
    opened.catch_up()
    table = opened.reuse(uri)
    if table is not None:
        return table
    table = load(uri)
    if table is not None:
        opened.keep(uri, table)
    return table


def at_version(uri: str, version: int, load: Callable[[str], Any | None]) -> Any | None:
    """The table at ``uri`` at ``version``: the one opened in this scope when it is at that
    version now (a read of the version just opened), else ``load(uri)``, which is not kept."""
    opened = _current()
    if opened is not None:
        opened.catch_up()
        kept = opened.tables.get(uri)
        if kept is not None and int(kept.table.version()) == version:
            return kept.table
    return load(uri)


@contextmanager
def removing(uri: str) -> Iterator[None]:
    """The block removes ``uri`` and what is under it: every scope opens it afresh after that.
    Said before and after, so a scope that opens it while it goes does not keep what went."""
    forget(uri)
    try:
        yield
    finally:
        forget(uri)


def forget(uri: str) -> None:
    """``uri`` and what is under it is being removed: every scope opens it afresh from now on."""
    global _removals
    with _lock:
        _removed.append(uri)
        _removals += 1
