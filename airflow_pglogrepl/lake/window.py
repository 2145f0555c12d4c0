"""A window of the drain: its changes written table by table, invisible until its commit, and
why a crash at any point loses nothing.

A drain goes one way: slot -> fetch -> decode -> ``Window(Lake, start)`` -> ``write`` batch
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
  a Spark ``VACUUM`` removes them (the upkeep's, delta-rs's "lite" one, removes only files the
  log removed: see ``lake.upkeep``).

A slot ahead of the lake's position means someone else consumed changes: refused, never skipped.

Why ``_pglogrepl/windows`` exists at all, when every changelog table already records its own
version: a window in which no published table changed touches no table, yet the slot must
advance past it (or an idle publication pins WAL for ever), and "slot ahead of the lake" needs
the position of the lake as a whole. The table is plain Delta too, so its rows (one per window
and snapshot: bounds, counts, writer) are the lake's readable history.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_pglogrepl.changelog.columns import COMMIT_LSN
from airflow_pglogrepl.exceptions import IncompatibleSchemaChangeError, UnsupportedColumnTypeError
from airflow_pglogrepl.lake import column_names, delta, evolve, mapping, schema_commits
from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.lake.quarantine import quarantine_schema
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake, Origins
    from airflow_pglogrepl.lake.mapping import MappedSchema
    from airflow_pglogrepl.models.records import ColumnOrigins

__all__ = ["CHANGES_CONFIG", "Window", "at_or_after"]

log = logging.getLogger("airflow_pglogrepl.lake")

# Only the commit LSN gets file statistics: it is what merges select changelog files by.
CHANGES_CONFIG = {**delta.KEEP_LOGS, "delta.dataSkippingStatsColumns": COMMIT_LSN}


@dataclass
class _Pending:
    schema: pa.Schema
    files: list[delta.DataFile] = field(default_factory=list)
    rows: int = 0
    # The table's column mapping as its files are written (None: none, files hold the lake
    # names); a table that exists without one turns it on at the commit (``commit_schema``).
    mapped: MappedSchema | None = None


class Window:
    """The changes of ``[start, end)`` being written; nothing is visible before ``commit``."""

    def __init__(self, lake: Lake, start: LSN) -> None:
        self.lake = lake
        self.start = start
        self._pending: dict[str, _Pending] = {}
        self._prefix = f"{int(start):016X}"
        self._quarantined: list[pa.Table] = []  # rows for ``_pglogrepl/quarantine``

    def quarantine(self, rows: pa.Table) -> None:
        """Keep ``rows`` (``lake.quarantine.rows``: a held table's changes) in the lake's
        quarantine with this window: committed before its commit point, as a table is."""
        if rows.num_rows:
            self._quarantined.append(rows)

    def write(self, table: TableRef, batch: pa.Table) -> int:
        """Write one batch of ``table``'s changelog rows; returns how many were new.

        The batch's columns get their lake names first (``lake.column_names``: any PostgreSQL
        name is kept, under column mapping when Delta needs it, and a name Delta would take for
        another's gets a suffix). Rows of transactions the lake already holds (a window
        drained again after a crash between two tables' commits, or changes a re-snapshot of
        the table includes) are dropped here, so a replay never duplicates a change. The
        batch's columns are checked against what the lake knows of the table before anything
        is written (``lake.evolve``).
        """
        name = table_dir(table)
        pending = self._pending.get(name)
        known = pending.schema if pending is not None else self.lake.known_schema(table)
        batch, lake_names = column_names.to_lake(batch, known)
        readded = self._check_order(table, known, lake_names)
        floor = self.lake.floor(name, self.start)
        if floor:
            batch = at_or_after(batch, floor)
        if batch.num_rows == 0:
            return 0
        evolution = evolve.evolve(str(table), known, batch.schema, first=evolve.first_row(batch))
        schema = evolution.schema
        if evolution.needs_origins and self.lake.origins is not None:
            origins = _origins_by_lake_name(self.lake.origins, table, evolution.asked, lake_names)
            schema = evolve.with_origins(str(table), known, evolution, origins)
            if evolution.added and evolve.describe(schema):
                log.info("%s: new columns %s", table, evolve.describe(schema))
        else:
            evolve.check_key(str(table), evolution, {})
        if readded:  # their new numbers, so a later cycle of renames is seen
            schema = evolve.numbered(schema, readded)
        renames = column_names.renamed_since(known, schema)
        if renames:
            log.warning("%s: columns renamed at the source, renamed in the lake (their history "
                        "and values kept): %s", table, renames)  # fmt: skip
        refused = delta.unsupported_columns(schema)
        if refused:
            raise UnsupportedColumnTypeError(str(table), refused)
        other = {s: n for s, n in lake_names.items()
                 if s != n and (known is None or n in evolution.added)}  # fmt: skip
        if other and other.items() - self.lake.stored_as.get(str(table), {}).items():
            log.warning("%s: columns stored under other names, as Delta cannot hold them "
                        "beside the table's others: %s", table, other)  # fmt: skip
            self.lake.stored_as.setdefault(str(table), {}).update(other)
        mapped = self._mapping(name, pending, known, schema, renames)
        if pending is None:
            pending = self._pending[name] = _Pending(schema)
        pending.schema, pending.mapped = schema, mapped
        batch = evolve.conform(batch, schema)
        uri = self.lake.paths.changes(name)
        stored = batch if mapped is None else mapping.to_physical(batch, mapped)
        pending.files.append(delta.write_file(uri, stored, self._prefix))
        pending.rows += batch.num_rows
        return int(batch.num_rows)

    def _commit_quarantine(self, end: LSN) -> None:
        _quarantine_commit(self.lake, self._quarantined, self._prefix, end)

    def _check_order(self, table: TableRef, known: pa.Schema | None,
                     lake_names: dict[str, str]) -> dict[str, int]:  # fmt: skip
        """Refuse names that moved between columns (``RENAME COLUMN`` in a cycle: ``b`` to
        ``c`` and ``c`` to ``b``), which pgoutput shows as the same names in another order and
        which would store each column's values under the other's name; returns the new
        attribute numbers of columns dropped and added again under their names (the lake's
        same columns), to record.

        Columns come in attnum order, so known names out of the order of the numbers the lake
        recorded for them (or, without numbers, of the lake's columns) mean a cycle of renames,
        or a column dropped and added again; the catalog tells which, asked once per column
        list and run."""
        if known is None or self.lake.origins is None:
            return {}
        place = {f.name: i for i, f in enumerate(known)}
        numbers: dict[str, int] = {}
        for f in known:
            number = evolve.attnum(f)
            if number:
                numbers[f.name] = number
        order = [numbers[n] for n in lake_names.values() if n in numbers]
        if not numbers:  # a lake from before attribute numbers: the order it saw them in
            order = [place[n] for n in lake_names.values() if n in place]
        if order == sorted(order):
            return {}
        seen = (str(table), tuple(lake_names))
        if seen in self.lake.checked_orders:
            return {}
        found = self.lake.origins(table, list(lake_names))
        now = {s: o.attnum for s, o in found.columns.items() if o.attnum is not None}
        moved, readded = [], {}
        for source, lake_name in lake_names.items():
            recorded = numbers.get(lake_name)
            current = now.get(source)
            if lake_name not in place or not recorded or current in (None, recorded):
                continue
            if recorded in now.values():
                moved.append(lake_name)
            else:  # its old number is gone: dropped, and added again under its name
                readded[lake_name] = int(current)
        if moved:
            raise IncompatibleSchemaChangeError(
                str(table),
                f"columns {sorted(moved)} took each other's names (RENAME COLUMN in a cycle)",
            )
        self.lake.checked_orders.add(seen)
        return readded

    def _mapping(self, name: str, pending: _Pending | None, before: pa.Schema | None,
                 schema: pa.Schema, renames: dict[str, str]) -> MappedSchema | None:  # fmt: skip
        """The column mapping ``changes/<name>`` is written under with ``schema`` (the
        table's schema was ``before``; ``renames`` happened since). A table that exists without
        one turns it on at the commit: an upgrade in place.

        A table gets a mapping when one of its names needs it, or a column is renamed (a
        metadata-only change under mapping), and keeps it. Files written before it (by earlier
        windows, or earlier in this one) hold the lake names of their columns, which become
        those columns' physical names; new columns get new ones."""
        wanted = mapping.needed(schema) or bool(renames)
        if pending is not None and pending.mapped is not None:
            previous: MappedSchema | None = pending.mapped
        elif pending is not None and not wanted:
            return None  # (a table this window found unmapped stays so until it must not)
        else:
            table = delta.open_table(self.lake.paths.changes(name))
            previous = None if table is None else mapping.mapped_of(table)
            if previous is None and not wanted:
                return None
            if previous is None and pending is None and table is None:
                return mapping.mapped_schema(schema)  # a new table
            if previous is None:
                assert before is not None, "a table with files has a schema"
                previous = mapping.mapped_schema(before, as_named=True)
        assert previous is not None
        if renames:
            previous = mapping.renamed(previous, renames)
        return mapping.mapped_schema(schema, previous=previous)

    def commit(self, end: LSN, *, transactions: int, changes: int) -> dict[str, int]:
        """Make the window part of the lake (see the module docstring for the order)."""
        if end < self.start:
            raise ValueError(f"window end {end} is before its start {self.start}")
        lake = self.lake
        for name, pending in self._pending.items():
            held = lake.changes_version(name)
            if held is not None and held >= end:
                continue  # committed by the run that crashed; its rows were filtered out anyway
            uri = lake.paths.changes(name)
            expected = None if held is None else int(held)  # what the rows were filtered by
            table = delta.open_table(uri)
            current = None if table is None else delta.unmapped(delta.schema_of(table))
            lake.check_writer()
            now = None if table is None else mapping.mapped_of(table)
            if pending.mapped is not None and table is not None and now != pending.mapped:
                # columns added or renamed, or mapping turned on, in one commit with the files
                # (delta-rs cannot change a mapped table's schema; durable: durability.put_commit)
                schema_commits.commit_with_schema(uri, pending.mapped, pending.files, app=lake.app,
                                           version=int(end), expected=expected)  # fmt: skip
                lake.committed_changes(name, end)
                continue
            plain = current is not None and pending.mapped is None
            if plain and not _covers(current, pending.schema):
                delta.evolve_schema(uri, pending.schema)  # new columns: a version first
            delta.commit_files(
                uri,
                pending.schema,
                pending.files,
                app=lake.app,
                version=int(end),
                expected=expected,
                configuration=CHANGES_CONFIG,
                name=name,
                mapping=pending.mapped if current is None else None,
            )
            lake.committed_changes(name, end)
        if self._quarantined:
            self._commit_quarantine(end)
        counts = {name: p.rows for name, p in self._pending.items()}
        lake.record(kind="window", start=self.start, end=end, transactions=transactions,
                    changes=changes, tables=counts)  # fmt: skip
        return counts


def _quarantine_commit(lake: Lake, rows: list[pa.Table], prefix: str, end: LSN) -> None:
    """Commit ``rows`` to ``_pglogrepl/quarantine`` with the app transaction ``end``, unless a
    run that crashed after committing them did already (a replay adds nothing twice)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    uri = lake.paths.quarantine()
    held = delta.txn_version(uri, lake.app)
    if held is not None and held >= int(end):
        return
    table = pa.concat_tables(rows)
    if held is not None:  # what a run that crashed after its commit holds there already
        table = table.filter(pc.greater_equal(table.column("commit_lsn"), held))
    if table.num_rows == 0:
        return
    written = delta.write_file(uri, table, prefix)
    lake.check_writer()
    delta.commit_files(uri, quarantine_schema(), [written], app=lake.app, version=int(end),
                       expected=held, name="pglogrepl quarantine",
                       configuration=delta.KEEP_LOGS)  # fmt: skip


def _origins_by_lake_name(origins: Origins, table: TableRef, asked: Sequence[str],
                          lake_names: dict[str, str]) -> ColumnOrigins:  # fmt: skip
    """What the catalog says of the columns ``asked`` (lake names), asked by their source
    names and keyed by their lake names."""
    import dataclasses

    source_of = {lake: source for source, lake in lake_names.items()}
    found = origins(table, [source_of.get(n, n) for n in asked])
    by_lake = {lake_names.get(s, s): origin for s, origin in found.columns.items()}
    return dataclasses.replace(found, columns=by_lake)


def at_or_after(rows: pa.Table, floor: int) -> pa.Table:
    """The changelog rows whose commit LSN is at or after ``floor`` (``Lake.floor``)."""
    import pyarrow.compute as pc

    return rows.filter(pc.greater_equal(rows.column(COMMIT_LSN), floor))


def _covers(current: pa.Schema, wanted: pa.Schema) -> bool:
    """Whether a table of schema ``current`` already has every column (and field) of ``wanted``,
    with the same column metadata."""
    have = dict(delta.column_types(current))
    if any(have.get(name) != kind for name, kind in delta.column_types(wanted)):
        return False
    return all((current.field(f.name).metadata or {}) == (f.metadata or {}) for f in wanted)
