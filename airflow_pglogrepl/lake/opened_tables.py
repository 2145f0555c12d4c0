"""A run's opened Delta tables: each table's log read once, then brought up to date.

Opening a Delta table reads its newest checkpoint and every commit after it. On an object store
that is one listing and about fifteen GETs (a checkpoint is read in ranges), some 40 ms on the
tests' S3 server; a drain run opens the windows table and each table it writes five to seven
times, and the merge and the upkeep each open a table several times. Brought up to date with
``update_incremental``, an opened table costs one listing and one GET per newer commit.

Why the result is what a fresh open would read: inside ``reused()`` the process holds the
lake's writer lock, so no other writer commits; commits this process makes (delta-rs, Spark,
the log entries ``lake.durability`` writes) are newer commits, which the update reads; and the
one way this process takes a table away, ``staging.remove``, says so (``forget``), and every
scope drops what was removed before its next open, so a table written again at the same place
is opened afresh. A table whose update fails is opened afresh too.

The scope is a context variable: a thread started inside it (the merge's Spark threads) does
not see it and opens tables afresh, so no table object is shared between threads. A thread
that should keep its own tables (the drain's write thread) enters, on each call, the
``Opened`` its scope keeps for it (``for_another_thread``): one thread at a time uses it.
Callers share an object within one thread: what they keep of it across another open is an
``int`` of its version, never the object as a snapshot.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["Opened", "at_version", "for_another_thread", "forget", "newest", "reused"]

log = logging.getLogger(__name__)

# Tables kept at most, the least recently opened dropped first: each holds its live files' list,
# and a run over many tables opens each one in turn, several times, before the next.
KEPT = 64

_lock = threading.Lock()
_removed: deque[str] = deque(maxlen=1024)  # the newest removals in this process
_removals = 0  # all removals in this process: a scope behind by more than the deque drops all


class Opened:
    """The tables one run, or one thread of it, keeps open."""

    def __init__(self) -> None:
        self.tables: OrderedDict[str, Any] = OrderedDict()
        self.other_thread: Opened | None = None  # (``for_another_thread``)
        with _lock:
            self._seen = _removals

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


_RUN: ContextVar[Opened | None] = ContextVar("pglogrepl_opened_tables", default=None)


@contextmanager
def reused(opened: Opened | None = None) -> Iterator[None]:
    """Within the block, ``newest`` keeps each table it opens (in ``opened``, default a new
    set) and updates it on the next open. A block inside another without ``opened`` uses the
    outer one's tables. Also a decorator: the function's call is the block."""
    if opened is None and _RUN.get() is not None:
        yield
        return
    token = _RUN.set(opened if opened is not None else Opened())
    try:
        yield
    finally:
        _RUN.reset(token)


def for_another_thread() -> Opened | None:
    """The tables a thread working for the current scope keeps, for it to enter with
    ``reused`` on each call (None: no scope here). They live as long as the scope does."""
    opened = _RUN.get()
    if opened is None:
        return None
    if opened.other_thread is None:
        opened.other_thread = Opened()
    return opened.other_thread


def newest(uri: str, load: Callable[[str], Any | None]) -> Any | None:
    """The table at ``uri`` at its newest version: the one opened earlier in this scope,
    brought up to date, or ``load(uri)`` (None: no table there; not kept)."""
    opened = _RUN.get()
    if opened is None:
        return load(uri)
    opened.catch_up()
    tables = opened.tables
    table = tables.get(uri)
    if table is not None:
        try:
            table.update_incremental()
            tables.move_to_end(uri)
            return table
        except Exception as exc:  # (its log changed under it: read it as a first open would)
            log.debug("%s opened afresh: bringing it up to date failed (%s)", uri, exc)
            del tables[uri]
    table = load(uri)
    if table is not None:
        tables[uri] = table
        if len(tables) > KEPT:
            tables.popitem(last=False)
    return table


def at_version(uri: str, version: int, load: Callable[[str], Any | None]) -> Any | None:
    """The table at ``uri`` at ``version``: the one opened in this scope when it is at that
    version now (a read of the version just opened), else ``load(uri)``, which is not kept."""
    opened = _RUN.get()
    if opened is not None:
        opened.catch_up()
        table = opened.tables.get(uri)
        if table is not None and int(table.version()) == version:
            return table
    return load(uri)


def forget(uri: str) -> None:
    """``uri`` and what is under it is being removed: every scope opens it afresh from now on."""
    global _removals
    with _lock:
        _removed.append(uri)
        _removals += 1
