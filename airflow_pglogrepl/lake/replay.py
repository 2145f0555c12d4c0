"""Replay and time travel by LSN: a table's changes between two LSNs, or its state as of a lake
position, read at the Delta versions that hold them.

Why no bookkeeping of its own: every version the drain writes carries the LSN it holds up to
(the app transaction ``(app_id(slot), end)``, see ``lake.window``), so "which version holds the
commits below b" and "which version is the table at P" are questions for the Delta logs, which
``lake.txnlog`` and ``lake.cut`` already answer. What this module adds is where each answer
stops being exact, so a caller gets the rows asked for or a refusal that says what the lake can
give (``ReplayRangeError``), never a silently incomplete table.

``changes_between(root, t, a, b)``: every changelog row of ``t`` whose commit LSN is in
``[a, b)``, ordered by ``(_commit_lsn, _seq)`` (the source's commit order).

* ``b`` must be at or below the lake's position: later changes are not part of the lake yet.
  Any LSN works, not only window ends: rows are selected by commit LSN, and read at a version
  that holds every commit below ``b``.
* ``a`` must be at or after the lake's beginning: the first window's start, or the initial
  snapshot's consistent point (nothing older was ever drained; the snapshot's state holds it).
* A re-snapshot of ``t`` at C writes its state at C and the drain then drops ``t``'s changes
  below C (see ``lake.cut``): the changelog has ``t``'s changes below its last change before the
  re-snapshot, T, and from C on, but not those in between. A range that starts below C and ends
  above T is refused. (Some of those ranges, ending before the lake reached the re-snapshot,
  would be whole; the logs do not say when that was, so they are refused too.) Re-snapshots are
  found in the state's log: a state version whose LSN is no window end.
* Rows are read at the table's newest version that holds them: the one at the lake's position,
  or for a range before a restarted changelog (``Lake.restart_changes``) the last one before the
  restart. ``VACUUM`` never removes a current version's files, so only such ranges can lose their
  files to it; log cleanup (``delta.logRetentionDuration``) bounds how far back a state's or a
  changelog's versions can be found. Either raises ``HistoryExpiredError``.

``state_as_of(root, t, P)``: the rows of ``state/t`` as they were at the lake position P, read
at the version ``consistent_cut(..., at=P)`` picks (deletion vectors applied). P must be a
committed window end (or the initial snapshot's point): between two window ends the lake holds
no state. The state is merged after the windows commit, and often after several of them, so a
state is not readable at every window end: where ``t`` changed in a window its state was not
merged at, the cut moves back to an earlier position, and this refuses and names the nearest
positions it can read (a state of an earlier position is not the state at P). A table the lake
did not hold yet at P has no rows there: an empty table of its current columns.

LSNs are ``airflow_pglogrepl.lsn.LSN`` values, their text (``'0/16B3748'``) or integers.
``*_spark`` variants return DataFrames read with ``versionAsOf`` at the same versions. Tables are
named as ``consistent_cut`` names them: a ``TableRef``, or its directory name
(``layout.table_dir``: ``schema.table`` for plain names).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import COMMIT_LSN, META_COLUMNS, SEQ, meta_fields
from airflow_pglogrepl.exceptions import ReplayRangeError, TableNotInLakeError
from airflow_pglogrepl.lake.cut import consistent_cut, only_slot
from airflow_pglogrepl.lake.layout import LakePaths, app_id, table_dir, table_from_dir
from airflow_pglogrepl.lake.txnlog import HistoryExpiredError, TxnLog
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["Lsn", "changes_between", "changes_between_spark", "state_as_of", "state_as_of_spark"]

_END = (1 << 64) - 1
# An LSN, its text (``'0/16B3748'``) or its integer (as Delta's transaction versions hold it).
Lsn = LSN | str | int


def changes_between(
    root: str,
    table: str | TableRef,
    start: Lsn,
    end: Lsn,
    *,
    slot: str | None = None,
) -> pa.Table:
    """Every changelog row of ``table`` whose commit LSN is in ``[start, end)``, ordered by
    ``(_commit_lsn, _seq)``, as a pyarrow Table (no JVM).

    :param root: the lake's root (a path or URI).
    :param table: a ``TableRef``, or the table's directory name (``schema.table``).
    :param start: the first commit LSN included (an ``LSN`` or its text).
    :param end: the first commit LSN not included; at or below the lake's position.
    :param slot: the drain whose positions to follow; needed when the lake holds several.
    :raises ReplayRangeError: the lake does not hold the whole range (the message says why and
        what it holds).
    :raises TableNotInLakeError: the lake has no table of that name.
    :raises HistoryExpiredError: log cleanup or ``VACUUM`` removed the versions that held it.
    """
    plan = _plan_changes(root, table, start, end, slot)
    if plan.version is None:
        return plan.empty
    rows = _read(plan.uri, plan.version, plan.name, plan.asked, _in_range(plan))
    return rows.sort_by([(c, "ascending") for c in _order(rows.column_names)])


def changes_between_spark(
    spark: Any,
    root: str,
    table: str | TableRef,
    start: Lsn,
    end: Lsn,
    *,
    slot: str | None = None,
) -> DataFrame:
    """``changes_between`` as a Spark DataFrame, read with ``versionAsOf`` and ordered the
    same way (in SQL: ``SELECT * FROM delta.`<uri>` VERSION AS OF <v> WHERE _commit_lsn >= a
    AND _commit_lsn < b ORDER BY _commit_lsn, _seq``)."""
    from pyspark.sql import functions as sf

    plan = _plan_changes(root, table, start, end, slot)
    if plan.version is None:
        return _empty_frame(spark, plan.empty)
    frame = spark.read.format("delta").option("versionAsOf", plan.version).load(plan.uri)
    lsn = sf.col(COMMIT_LSN)
    frame = frame.where((lsn >= sf.lit(plan.start)) & (lsn < sf.lit(plan.end)))
    result: DataFrame = frame.orderBy(*_order(frame.columns))
    return result


def state_as_of(
    root: str, table: str | TableRef, position: Lsn, *, slot: str | None = None
) -> pa.Table:
    """The rows of ``state/<table>`` as they were at the lake position ``position``, as a
    pyarrow Table (no JVM; deletion vectors applied).

    :param position: a committed window end (``lake.windows()``'s ``end_lsn``, or the position
        a ``consistent_cut`` reports).
    :raises ReplayRangeError: ``position`` is no committed window end of the lake, or the table's
        state was not merged there (the message names the nearest positions it was).
    :raises TableNotInLakeError: the lake has no table of that name.
    :raises HistoryExpiredError: log cleanup or ``VACUUM`` removed the version that held it.
    """
    plan = _plan_state(root, table, position, slot)
    if plan.version is None:
        return plan.empty
    return _read(plan.uri, plan.version, plan.name, plan.asked, None)


def state_as_of_spark(
    spark: Any, root: str, table: str | TableRef, position: Lsn, *, slot: str | None = None
) -> DataFrame:
    """``state_as_of`` as a Spark DataFrame, read with ``versionAsOf``."""
    plan = _plan_state(root, table, position, slot)
    if plan.version is None:
        return _empty_frame(spark, plan.empty)
    frame: DataFrame = spark.read.format("delta").option("versionAsOf", plan.version).load(plan.uri)
    return frame


# -- what to read -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """One table's Delta version to read (None: nothing to read, ``empty`` is the answer)."""

    name: str  # the table's directory name
    uri: str
    version: int | None
    asked: str  # what was asked, for messages: "changes in [a, b)", "state as of P"
    start: int = 0
    end: int = 0
    empty_schema: pa.Schema | None = None

    @property
    def empty(self) -> pa.Table:
        assert self.empty_schema is not None
        return self.empty_schema.empty_table()


class _History:
    """What one call reads of a lake before its table: the slot's committed positions (read
    first, so every table version they name is already in the logs listed after them)."""

    def __init__(self, root: str, table: str | TableRef, slot: str | None) -> None:
        from airflow_pglogrepl.lake.lake import Lake

        self.paths = LakePaths(root)
        self.slot = slot if slot is not None else only_slot(self.paths)
        self.name = table if isinstance(table, str) else table_dir(table)
        self.shown = str(table) if isinstance(table, TableRef) else str(table_from_dir(table))
        rows = Lake(self.paths.root, self.slot).windows()
        if not rows:
            raise ReplayRangeError(self.shown, "a replay", f"lake {self.paths.root} holds no "
                                   f"committed window of slot {self.slot!r}", "nothing yet",
                                   "drain (or snapshot) into it first")  # fmt: skip
        self.ends = sorted({int(LSN(r["end_lsn"])) for r in rows})
        self.beginning = min(int(LSN(r["start_lsn"])) for r in rows)
        self.position = self.ends[-1]
        self._all_ends = set(self.ends)
        self._reread = False
        app = app_id(self.slot)
        self.changes = TxnLog(self.paths.changes(self.name), app)
        self.state = TxnLog(self.paths.state(self.name), app)
        if not self.changes.exists and not self.state.exists:
            from airflow_pglogrepl.lake.delta import list_tables

            known = sorted(set(list_tables(f"{self.paths.root}/changes"))
                           | set(list_tables(f"{self.paths.root}/state")))  # fmt: skip
            raise TableNotInLakeError(self.shown, self.paths.root, known)

    def is_window_end(self, lsn: int) -> bool:
        """Whether ``lsn`` is a committed window end; past the position read first, the windows
        are read again: a merge there (committed after its window) is no re-snapshot."""
        if lsn > self.position and not self._reread:
            from airflow_pglogrepl.lake.lake import Lake

            self._reread = True
            rows = Lake(self.paths.root, self.slot).windows()
            self._all_ends = {int(LSN(r["end_lsn"])) for r in rows}
        return lsn in self._all_ends

    def state_points(self, above: int) -> Iterator[int]:
        """The LSNs of the state's versions above ``above``, newest first."""
        bound = _END
        while True:
            found = self.state.at_or_below(bound)
            if found is None or found.txn <= above:
                return
            yield found.txn
            bound = found.txn - 1

    def empty_schema(self, kind: str) -> pa.Schema:
        """The columns of an answer with no rows: the table's newest schema of ``kind``; for
        changes of a table no change of reached the lake yet, its state's columns and the
        changelog's metadata columns."""
        import pyarrow as pa

        from airflow_pglogrepl.lake.delta import arrow_schema

        changes = arrow_schema(self.paths.changes(self.name))
        state = arrow_schema(self.paths.state(self.name))
        if kind == "changes":
            if changes is not None:
                return changes
            assert state is not None, "the table has a changelog or a state (_History)"
            return pa.schema([*state, *meta_fields(list(state))])
        if state is not None:
            return state
        assert changes is not None, "the table has a changelog or a state (_History)"
        return pa.schema([f for f in changes if f.name not in META_COLUMNS])


def _plan_changes(
    root: str, table: str | TableRef, start: Lsn, end: Lsn, slot: str | None
) -> _Plan:
    low, high = LSN(start), LSN(end)
    asked = f"changes in [{low}, {high})"
    lake = _History(root, table, slot)
    shown, position, beginning = lake.shown, LSN(lake.position), LSN(lake.beginning)
    whole = f"its changes in [{beginning}, {position})"
    if low > high:
        raise ReplayRangeError(shown, asked, "the range starts after it ends", whole,
                               "pass the earlier LSN first")  # fmt: skip
    if high > position:
        raise ReplayRangeError(shown, asked, f"the lake's position is {position}: changes "
                               "after it are not in the lake yet", whole,
                               f"end at {position} at most, or drain first")  # fmt: skip
    if low < beginning:
        raise ReplayRangeError(shown, asked, f"the lake begins at {beginning} (its first "
                               "window or initial snapshot): nothing older was drained", whole,
                               f"start at {beginning} or later")  # fmt: skip
    stuck = _quarantined_since(root, lake)
    if stuck is not None and high > stuck:
        raise ReplayRangeError(
            shown, asked,
            f"its changes from {stuck} on are in the lake's quarantine (_pglogrepl/quarantine: "
            f"they could not be stored), not in its changelog",
            f"its changes in [{beginning}, {stuck})",
            f"end at {stuck} at most; re-snapshot the table to bring it back (its quarantined "
            f"changes are then in its state)",
        )  # fmt: skip
    # The newest version, not the one at the position: a run that crashed between a table's
    # commit and its windows row, replayed with smaller windows, left rows below the position
    # in a commit above it (the replay skipped them: the table held them). Rows are chosen by
    # commit LSN, so nothing past ``high`` is read.
    read_at = _END
    try:
        for point in lake.state_points(above=int(low)):
            if lake.is_window_end(point):
                continue  # a merge (or the initial snapshot): the changelog goes on
            before = lake.changes.at_or_below(point - 1)
            last = lake.beginning if before is None else before.txn
            if int(high) > last:
                gap = f"[{LSN(last)}, {LSN(point)})"
                raise ReplayRangeError(
                    shown, asked,
                    f"it was re-snapshotted at {LSN(point)}: the changelog does not hold its "
                    f"changes in {gap}, the state took them",
                    f"its changes in [{beginning}, {LSN(last)}) and in [{LSN(point)}, "
                    f"{position})",
                    f"ask for a range inside one of those, and read the state at a position "
                    f"after {LSN(point)} (state_as_of) for what the re-snapshot took",
                )  # fmt: skip
            read_at = min(read_at, point - 1)  # before a changelog that may have restarted
        found = lake.changes.at_or_below(read_at)
    except HistoryExpiredError as exc:
        raise HistoryExpiredError(
            f"{asked} of {shown}: the Delta log no longer reaches back that far ({exc}). Fix: "
            f"ask for a later range; keep more history with the tables' "
            f"delta.logRetentionDuration"
        ) from exc
    if found is None:
        return _Plan(lake.name, lake.paths.changes(lake.name), None, asked,
                     empty_schema=lake.empty_schema("changes"))  # fmt: skip
    return _Plan(lake.name, lake.paths.changes(lake.name), found.version, asked, int(low),
                 int(high))  # fmt: skip


def _quarantined_since(root: str, lake: _History) -> LSN | None:
    """Where the table's quarantine begins, when it is in the lake's quarantine."""
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lake.quarantine import held

    for ref, cause in held(Lake(root, lake.slot)).items():
        if table_dir(ref) == lake.name:
            return LSN(cause.since)
    return None


def _plan_state(root: str, table: str | TableRef, position: Lsn, slot: str | None) -> _Plan:
    at = LSN(position)
    asked = f"state as of {at}"
    lake = _History(root, table, slot)
    shown = lake.shown
    if int(at) not in lake.ends:
        below = max((e for e in lake.ends if e < int(at)), default=None)
        above = min((e for e in lake.ends if e > int(at)), default=None)
        near = " and ".join(str(LSN(e)) for e in (below, above) if e is not None)
        why = (f"the lake's position is {LSN(lake.position)}" if int(at) > lake.position
               else f"{at} is no committed window end (the nearest are {near})")  # fmt: skip
        raise ReplayRangeError(shown, asked, why, "its state at committed window ends only",
                               "pass a window end (lake.windows()'s end_lsn), or "
                               "consistent_cut(root, at=...).position for the newest at or "
                               "below an LSN")  # fmt: skip
    try:
        cut = consistent_cut(lake.paths.root, [lake.name], kind="state", slot=lake.slot, at=at)
        if cut.position != at:
            raise _lagging(lake, asked, at, cut.position)
    except HistoryExpiredError as exc:
        raise HistoryExpiredError(
            f"{asked} of {shown}: the Delta log no longer reaches back that far ({exc}). Fix: "
            f"ask for a later position; keep more history with the state's "
            f"delta.logRetentionDuration"
        ) from exc
    version = cut.versions[lake.name]
    empty = lake.empty_schema("state") if version is None else None
    return _Plan(lake.name, lake.paths.state(lake.name), version, asked, empty_schema=empty)


def _lagging(lake: _History, asked: str, at: LSN, back: LSN | None) -> ReplayRangeError:
    """The refusal of a position the table's state was not merged at, naming the readable
    positions next to it: the cut's, below, and the first merge after it."""
    later = [p for p in lake.state_points(above=int(at)) if lake.is_window_end(p)]
    near = [f"{back} (before)"] if back is not None else []
    near += [f"{LSN(min(later))} (after)"] if later else []
    return ReplayRangeError(
        lake.shown, asked,
        f"it changed in a window before {at} and its state was not merged at {at}: the state "
        f"of an earlier position is not the state at {at}",
        f"its state at {' and '.join(near) or 'no position yet'}",
        f"read one of those, and changes_between(...) from it to {at} for what happened in "
        f"between; or merge after each window (materialize) to have a state at every position",
    )  # fmt: skip


# -- reading ------------------------------------------------------------------------------------


def _in_range(plan: _Plan) -> str:
    """The commit LSN filter: two integers and a fixed column name, nothing a caller wrote."""
    return f'"{COMMIT_LSN}" >= {int(plan.start)} AND "{COMMIT_LSN}" < {int(plan.end)}'


def _order(columns: list[str]) -> list[str]:
    return [c for c in (COMMIT_LSN, SEQ) if c in columns]


def _read(uri: str, version: int, name: str, asked: str, where: str | None) -> pa.Table:
    """The table at ``version`` through DataFusion (deletion vectors applied; the filter skips
    files by their commit LSN statistics), in the table's schema. Only integers are put in the
    predicate."""
    from airflow_pglogrepl.lake.delta import scan

    try:
        return scan(uri, version=version, where=where)
    except Exception as exc:  # delta-rs raises its own classes for a file VACUUM removed
        if not _missing_file(exc):
            raise
        raise HistoryExpiredError(
            f"{asked} of {table_from_dir(name)}: version {version} of {uri}, which holds it, "
            f"lost files to VACUUM ({exc}). Fix: ask for a later range or position; keep more "
            f"history with delta.deletedFileRetentionDuration"
        ) from exc


def _missing_file(exc: Exception) -> bool:
    text = str(exc)
    return isinstance(exc, FileNotFoundError) or any(
        sign in text for sign in ("not found", "No such file", "NotFound")
    )


def _empty_frame(spark: Any, empty: pa.Table) -> DataFrame:
    from pyspark.sql.pandas.types import from_arrow_schema

    frame: DataFrame = spark.createDataFrame([], from_arrow_schema(empty.schema))
    return frame
