"""A consistent cut: for a set of tables, the Delta versions that all hold the lake at one LSN.

Delta Lake has no transaction across tables. One source transaction that wrote two tables
reaches the lake as one Delta commit per table, so a reader who opens each table at its latest
version can see it half-applied: ``changes/a``'s window committed and ``changes/b``'s not yet,
or ``state/a`` merged and ``state/b`` not yet. Every version the drain writes carries the app
transaction ``(app_id(slot), LSN)`` (see ``lake.window``), so the versions that belong together can
be found from the logs alone: ``consistent_cut`` finds them, ``read_cut`` reads them (no JVM) and
``read_cut_spark`` does the same with ``versionAsOf``.

What the cut is, at the lake's position L (``_pglogrepl/windows``'s transaction version):

* its ``position`` P is the end of a committed window (or the initial snapshot's consistent
  point) at or below L: the changes of every transaction that commits before P are in, none
  after. A changes table whose transaction is above L (committed, the windows row not yet) is
  read below it: those rows are not part of the lake yet;
* ``changes/t`` at P is its newest version whose transaction is at or below P (versions without
  one, such as a schema change, hold the rows of the transaction before them);
* ``state/t`` at P is its newest version whose transaction v is at or below P, readable when the
  changelog had nothing for t between v and P (its newest transaction at or below P is at most
  v): the state of v is then the table at P. The merge runs after the windows commit, so a
  state may lag: the cut then moves back to the greatest P every requested table can be read at,
  and reports it. Going back, a table is skipped past whole spans (below the changelog
  transaction that was not merged), so the search reads few log entries;
* a table that has no changes and no state at P (created later, or never published) is None.

Re-snapshotted tables: a re-snapshot writes ``state/t`` as one version at a temporary slot's
consistent point C, no window end and usually ahead of L, and the drain then drops t's changes
below C (the state holds them), restarting or keeping the changelog from C. C is never offered
as a position (the lake's other tables are at no defined point there); the state of C is read at
window ends P >= C and the older state with the older changelog below C. Because the changelog
has no rows for t just below C, an older state version can look current at a P past C: so the cut
always takes the newest state version at or below P, never an older one that passes the test.
A changes cut over a re-snapshot is not t's whole history (the changes before C are in the
state, not the changelog); across tables it is still cut at P.

A replay after a crash with a smaller window than the crashed run (``max_window_bytes``
lowered) can leave a table's commit ending above the windows row that holds its first rows; such
a table is read below that commit until the windows reach it.

Time travel: with ``at``, L is the newest window end at or below ``at`` instead of the lake's
position now, and everything above is taken as it is at L. That works because every version
keeps its transaction: the logs answer for a past position as for the present one, as long as
log cleanup and ``VACUUM`` left the versions (``lake.replay`` builds its calls on this).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake.layout import LakePaths, app_id, table_dir
from airflow_pglogrepl.lake.storage import filesystem
from airflow_pglogrepl.lake.txnlog import HistoryExpiredError, TxnLog, TxnVersion
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger("airflow_pglogrepl.lake")

Kind = Literal["state", "changes"]
_END = (1 << 64) - 1


@dataclass(frozen=True)
class Cut:
    """Delta versions of some tables that all hold the lake at ``position``.

    ``versions`` maps each table's directory name (``layout.table_dir``) to the version to read,
    or None when the table does not exist at ``position``. ``position`` is None when nothing can
    be read consistently yet (no window committed, or every state lags the first one).
    """

    root: str
    kind: Kind
    slot: str
    position: LSN | None
    versions: Mapping[str, int | None] = field(default_factory=dict)

    def uri(self, table: str | TableRef) -> str:
        """The URI of one of the cut's tables."""
        paths = LakePaths(self.root)
        return paths.state(table) if self.kind == "state" else paths.changes(table)


def _before_quarantine(root: str, slot: str, names: Sequence[str], upto: int) -> int:
    """``upto``, or before the first quarantined change of a table of ``names`` in the lake's
    quarantine (``lake.quarantine``): that table's changelog and state stop there, and would
    look current at any later position."""
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lake.quarantine import held

    stuck = {str(ref): cause for ref, cause in held(Lake(root, slot)).items()
             if table_dir(ref) in names}  # fmt: skip
    if not stuck:
        return upto
    since = min(int(LSN(cause.since)) for cause in stuck.values())
    if since < upto:
        log.warning("cut of %s taken at or before %s: %s in the lake's quarantine since then "
                    "(leave them out of tables= for a later cut of the others)", root,
                    LSN(since), sorted(stuck))  # fmt: skip
    return min(upto, since)


def consistent_cut(
    root: str,
    tables: Sequence[str | TableRef] | None = None,
    *,
    kind: Kind = "state",
    slot: str | None = None,
    at: LSN | str | int | None = None,
) -> Cut:
    """The versions of ``tables`` (default: every table of ``kind`` in the lake) that all hold
    the lake at one committed position, read from the Delta logs alone (no JVM, no SQL).

    ``slot`` names the drain whose app transactions to follow; without it the lake must hold
    exactly one slot's windows. ``at`` (an LSN, its text such as ``'0/16B3748'``, or an int)
    travels back: the cut is then taken at the newest committed position at or below ``at``
    instead of the lake's position now (None when no window had committed there). Raises
    ``HistoryExpiredError`` when a table can only be read consistently at a version log
    cleanup removed (its state has not been merged for longer than
    ``delta.logRetentionDuration``, or ``at`` is older than the log keeps).
    """
    if kind not in ("state", "changes"):
        raise ValueError(f"kind must be 'state' or 'changes', not {kind!r}")
    paths = LakePaths(root)
    upto = _END if at is None else int(LSN(at))
    slot = slot if slot is not None else only_slot(paths)
    app = app_id(slot)
    # The position first, the tables' logs after: every changes commit at or below it is then
    # listed (a window's tables commit before its windows row), and states seen are a prefix.
    windows = _Positions(paths, slot)
    names = _names(paths, kind) if tables is None else [_dir(t) for t in tables]
    upto = _before_quarantine(root, slot, names, upto)
    lake_position = windows.at_or_below(upto)
    if lake_position is None:
        return Cut(paths.root, kind, slot, None, dict.fromkeys(names))
    changes = {n: TxnLog(paths.changes(n), app) for n in names}
    if kind == "changes":
        return Cut(paths.root, kind, slot, LSN(lake_position),
                   {n: _version(changes[n].at_or_below(lake_position)) for n in names})  # fmt: skip
    states = {n: TxnLog(paths.state(n), app) for n in names}
    bound = lake_position
    while True:
        position = windows.at_or_below(bound)
        if position is None:
            return Cut(paths.root, kind, slot, None, dict.fromkeys(names))
        versions: dict[str, int | None] = {}
        lower = None
        for name in names:
            state = states[name].at_or_below(position)
            last = changes[name].at_or_below(position)
            if last is None or (state is not None and last.txn <= state.txn):
                versions[name] = _version(state)
            else:  # changes up to ``last`` not merged: no P in [last, position] works for it
                lower = last.txn - 1 if lower is None else min(lower, last.txn - 1)
        if lower is None:
            return Cut(paths.root, kind, slot, LSN(position), versions)
        bound = lower


def read_cut(cut: Cut) -> dict[str, pa.Table]:
    """Each table of the cut that exists at its position, as a pyarrow Table (no JVM); tables
    that do not exist there are left out."""
    from airflow_pglogrepl.lake.delta import read_table

    return {
        name: read_table(cut.uri(name), version)
        for name, version in cut.versions.items()
        if version is not None
    }


def read_cut_spark(spark: Any, cut: Cut) -> dict[str, DataFrame]:
    """Each table of the cut that exists at its position, as a Spark DataFrame read with
    ``versionAsOf`` (in SQL: ``SELECT * FROM delta.`<uri>` VERSION AS OF <version>``)."""
    return {
        name: spark.read.format("delta").option("versionAsOf", version).load(cut.uri(name))
        for name, version in cut.versions.items()
        if version is not None
    }


class _Positions:
    """The window ends of one slot at or below a bound: the windows table's log, newest first;
    past what log cleanup left, its rows (every window's row stays in the table)."""

    def __init__(self, paths: LakePaths, slot: str) -> None:
        self._uri = paths.windows()
        self._slot = slot
        self._log = TxnLog(self._uri, app_id(slot))
        self._ends: list[int] | None = None

    def at_or_below(self, bound: int) -> int | None:
        if self._ends is None:
            try:
                found = self._log.at_or_below(bound)
                return None if found is None else found.txn
            except HistoryExpiredError:
                self._ends = self._read_ends()
        return max((end for end in self._ends if end <= bound), default=None)

    def _read_ends(self) -> list[int]:
        from airflow_pglogrepl.lake.delta import read_table

        rows = read_table(self._uri, self._log.newest).select(["slot", "end_lsn"]).to_pylist()
        # (a claim row has no LSNs: ``Lake.claim``)
        return [int(LSN(r["end_lsn"])) for r in rows if r["slot"] == self._slot and r["end_lsn"]]


def only_slot(paths: LakePaths) -> str:
    """The one slot whose windows the lake holds (a lake may hold several: then name it)."""
    from airflow_pglogrepl.lake.delta import open_table, read_table

    if open_table(paths.windows()) is None:
        raise LakeError(f"{paths.root} holds no committed window: pass the slot to read it by")
    slots = sorted(set(read_table(paths.windows()).column("slot").to_pylist()))
    if len(slots) != 1:
        raise LakeError(f"{paths.root} holds the windows of slots {slots}: pass slot=")
    return str(slots[0])


def _names(paths: LakePaths, kind: Kind) -> list[str]:
    """The table directories of ``kind`` (for state: those with a changelog too, whose state may
    not exist yet)."""
    names = set(_table_dirs(f"{paths.root}/changes"))
    if kind == "state":
        names |= set(_table_dirs(f"{paths.root}/state"))
    return sorted(names)


def _table_dirs(parent: str) -> list[str]:
    """Directories under ``parent`` that hold a Delta log (listed, not opened)."""
    from pyarrow import fs

    system, base = filesystem(parent)
    try:
        infos = system.get_file_info(fs.FileSelector(base, allow_not_found=True))
    except FileNotFoundError:
        return []
    folders = [i.base_name for i in infos if i.type == fs.FileType.Directory]
    logs = system.get_file_info([f"{base}/{name}/_delta_log" for name in folders])
    return [name for name, log in zip(folders, logs, strict=True)
            if log.type == fs.FileType.Directory]  # fmt: skip


def _dir(table: str | TableRef) -> str:
    return table if isinstance(table, str) else table_dir(table)


def _version(found: TxnVersion | None) -> int | None:
    return None if found is None else found.version
