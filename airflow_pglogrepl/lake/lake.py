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

import datetime as dt
import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import COMMIT_LSN
from airflow_pglogrepl.exceptions import (
    IncompatibleSchemaChangeError,
    LakeOfAnotherSlotError,
    SinkFromAnotherSourceError,
    UnsupportedColumnTypeError,
)
from airflow_pglogrepl.lake import delta, evolve, mapping, names
from airflow_pglogrepl.lake.layout import LAKE_APP, LakePaths, app_id, table_dir
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.mapping import MappedSchema
    from airflow_pglogrepl.models.records import ColumnOrigins

# What the source's catalog says of columns the lake sees for the first time (PgSource's
# ``column_origins``): how rows from before an ``ADD COLUMN`` read it, and ``relnatts``.
Origins = Callable[[TableRef, Sequence[str]], "ColumnOrigins"]

log = logging.getLogger("airflow_pglogrepl.lake")

# Only the commit LSN gets file statistics: it is what merges select changelog files by.
CHANGES_CONFIG = {**delta.KEEP_LOGS, "delta.dataSkippingStatsColumns": COMMIT_LSN}
# Every this many versions the windows table's one-row files are compacted and its log
# checkpointed, so reading the lake's history and position stays cheap however long it runs.
COMPACT_EVERY = 100


def windows_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("kind", pa.string()),  # "window", "snapshot" or "claim" (Lake.claim)
            pa.field("slot", pa.string()),
            pa.field("start_lsn", pa.string()),
            pa.field("end_lsn", pa.string()),
            pa.field("transactions", pa.int64()),
            pa.field("changes", pa.int64()),
            pa.field("tables", pa.string()),  # JSON: table -> rows written
            pa.field("committed_at", pa.timestamp("us", tz="UTC")),
            pa.field("writer", pa.string()),  # host:pid
            # JSON: system_identifier, timeline, database of the source (``source_identity``);
            # in a claim, the lake's identity (``Lake.claim``)
            pa.field("source", pa.string()),
        ]
    )


_UNREAD = object()  # the lake's position before this object read it


class Lake:
    """One lake root as the drain of one slot sees it.

    ``writer_check`` proves the run still holds the lake's writer lock
    (``hooks.pg.locks.WriterLock.check``); it is called before every commit this object makes,
    and the drain calls it before every slot advance.

    ``state_deletion_vectors`` is what this run asks of the state tables it creates (None: what
    the lake records, on for a lake that records nothing); ``claim`` records it, so that every
    later run, whatever it is told, creates state tables the same way (``state_config``).
    """

    def __init__(
        self,
        root: str,
        slot: str,
        *,
        origins: Origins | None = None,
        writer_check: Callable[[], None] | None = None,
        state_deletion_vectors: bool | None = None,
    ) -> None:
        self.paths = LakePaths(root)
        self.slot = slot
        self.app = app_id(slot)
        self.origins = origins
        self.writer_check = writer_check
        self.state_deletion_vectors = state_deletion_vectors
        # the source's identity, recorded with each commit (set by the drain and the snapshot)
        self.source: dict[str, object] | None = None
        self._versions: dict[str, LSN | None] = {}
        self._covered: dict[str, LSN | None] = {}
        self._position: object = _UNREAD
        self._orders_checked: set[tuple[str, tuple[str, ...]]] = set()  # (``Window``)
        # table -> {source name: lake name} of columns this run stored under another name
        self.stored_as: dict[str, dict[str, str]] = {}

    def check_writer(self) -> None:
        """Prove this run may still write (``WriterLockLostError`` if not)."""
        if self.writer_check is not None:
            self.writer_check()

    @property
    def root(self) -> str:
        return self.paths.root

    # -- where the lake stands ------------------------------------------------------------------

    def position(self) -> LSN | None:
        """The end of the last committed window (or snapshot); None for a lake never committed.

        Read from the log each time; the value read is what this run's next commit point
        expects to find there (``record``)."""
        version = delta.txn_version(self.paths.windows(), self.app)
        self._position = None if version is None else LSN(version)
        return self._position

    def changes_version(self, table: TableRef | str) -> LSN | None:
        """The exclusive LSN bound of what ``changes/<table>`` holds (None: nothing yet)."""
        name = table if isinstance(table, str) else table_dir(table)
        if name not in self._versions:
            version = delta.txn_version(self.paths.changes(name), self.app)
            self._versions[name] = None if version is None else LSN(version)
        return self._versions[name]

    def covered(self, table: TableRef | str) -> LSN | None:
        """Below which commit LSN the lake already holds a table's changes: its changelog's
        version, or its state's when a re-snapshot put that further (the state then holds what
        the changes before it did)."""
        name = table if isinstance(table, str) else table_dir(table)
        if name not in self._covered:
            bounds = [v for v in (self.changes_version(name), self.state_version(name)) if v]
            self._covered[name] = max(bounds) if bounds else None
        return self._covered[name]

    def known_schema(self, table: TableRef | str) -> pa.Schema | None:
        """What the lake knows of a table's columns: its changelog's schema, else its state's
        (a snapshot made before the first change), else None."""
        for uri in (self.paths.changes(table), self.paths.state(table)):
            schema = delta.arrow_schema(uri)
            if schema is not None:
                return schema
        return None

    def restart_changes(self, table: TableRef, schema: pa.Schema, at: LSN) -> str:
        """After a re-snapshot of ``table`` at ``at``: make its changelog take ``schema`` (the
        table's columns now). Returns what was done: ``"kept"``, ``"evolved"`` (columns added
        at ``at``) or ``"restarted"`` (the old columns cannot take the new rows: the changelog
        is replaced by an empty one, its earlier versions stay readable until VACUUM).

        Call it only after the state of ``at`` is committed: the state then holds every change
        before ``at``, so nothing the changelog had is needed any more.
        """
        uri = self.paths.changes(table)
        current = delta.arrow_schema(uri)
        if current is None:
            return "kept"
        self._versions.pop(table_dir(table), None)
        self._covered.pop(table_dir(table), None)
        schema = names.to_lake(schema.empty_table(), current)[0].schema
        found = delta.open_table(uri)
        mapped = None if found is None else mapping.mapped_of(found)
        try:
            evolution = evolve.evolve(str(table), current, schema, first=f"{int(at)}:0")
            evolve.check_key(str(table), evolution, {})  # (a renamed key: restarted)
        except IncompatibleSchemaChangeError as why:
            log.warning("changelog of %s restarts at %s: %s", table, at, why)
            self.check_writer()
            if mapped is not None or mapping.needed(schema):
                mapping.reset_table(uri, schema, app=self.app, version=int(at))
            else:
                delta.reset_table(uri, schema, app=self.app, version=int(at))
            return "restarted"
        if not evolution.added:
            return "kept"
        self.check_writer()
        if mapped is not None or mapping.needed(evolution.schema):
            previous = mapped or mapping.mapped_schema(current, as_named=True)
            mapping.commit_schema(uri, mapping.mapped_schema(evolution.schema, previous=previous))
        else:
            delta.evolve_schema(uri, evolution.schema)
        return "evolved"

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
        rows = [r for r in self._rows() if r["slot"] == self.slot and r["kind"] != CLAIM]
        return sorted(rows, key=lambda r: LSN(r["end_lsn"]))

    def _rows(self) -> list[dict[str, Any]]:
        return self._claims_and_rows()[1]

    def _claims_and_rows(self) -> tuple[int | None, list[dict[str, Any]]]:
        """The claims' version (``LAKE_APP``) and every row of the windows table, read from one
        Delta version: what a claim's compare-and-set expects is what its check read."""
        table = delta.open_table(self.paths.windows())
        if table is None:
            return None, []
        held = table.transaction_version(LAKE_APP)
        rows = delta.read_table(self.paths.windows(), version=table.version()).to_pylist()
        return (None if held is None else int(held)), rows

    # -- how state tables are made -------------------------------------------------------------

    def state_config(self, table: TableRef | str, *, mapped: bool | None = None) -> dict[str, str]:
        """The Delta configuration to create ``state/<table>`` with, or to overwrite it with.

        A table that exists keeps its own deletion-vector setting: Spark's MERGE writes vectors
        or rewrites files by the table's property, so the setting of each table decides, and
        the lake's option only says how new tables are made. Without vectors, the table is
        created without the ``deletionVectors`` reader feature too, so readers that lack it
        (``DeltaTable.to_pandas()``) read it.

        A new state is under column mapping (``lake.mapping``) when ``mapped`` says so, or
        (None) when the table's changelog is: it holds the same names."""
        current = delta.open_table(self.paths.state(table))
        if current is not None:
            setting = current.metadata().configuration.get(DV_PROPERTY, "false")
            vectors = setting.strip().lower() == "true"
        else:
            vectors = self.state_vectors()
        config = {**delta.STATE_CONFIG, DV_PROPERTY: "true" if vectors else "false"}
        if current is None and mapped is None:
            changes = delta.open_table(self.paths.changes(table))
            mapped = changes is not None and mapping.is_mapped(changes)
        if current is None and mapped:
            config.update(mapping.TABLE_CONFIG)
        return config

    def align_state(self, table: TableRef | str, *, needed: bool = False) -> None:
        """Make ``state/<table>`` take its changelog's names before a merge (or a re-snapshot)
        writes into it: columns renamed at the source are renamed (metadata only: the state
        keeps their values), and column mapping is turned on in place when the changelog has
        it, a rename needs it, or ``needed`` (a re-snapshot brings a name that needs it). The
        state's files keep their names as physical names."""
        uri = self.paths.state(table)
        state = delta.open_table(uri)
        if state is None:
            return
        have = {f.name for f in delta.unmapped(_arrow(state))}
        changes = delta.open_table(self.paths.changes(table))
        renames: dict[str, str] = {}
        if changes is not None:
            for former, now in names.former_names(delta.unmapped(_arrow(changes))).items():
                if former in have and now not in have:
                    renames[former] = now
        wanted = needed or bool(renames) or (changes is not None and mapping.is_mapped(changes))
        if wanted and not mapping.is_mapped(state):
            self.check_writer()
            schema = delta.unmapped(_arrow(state))
            mapping.commit_schema(uri, mapping.mapped_schema(schema, as_named=True))
            log.info("state of %s is under column mapping from now on", table)
        if renames:
            self.check_writer()
            mapping.rename_columns(uri, renames)
            log.info("state of %s: columns renamed %s, their values kept", table, renames)

    def state_vectors(self) -> bool:
        """Whether state tables this run creates get deletion vectors: the run's own
        ``state_deletion_vectors`` when given, else what the lake records (``claim``), else
        on."""
        if self.state_deletion_vectors is not None:
            return self.state_deletion_vectors
        recorded = (self.identity() or {}).get(STATE_VECTORS)
        return True if recorded is None else bool(recorded)

    # -- whose lake it is -----------------------------------------------------------------------

    def identity(self) -> dict[str, Any] | None:
        """The lake's owner as its newest claim records it (slot, system_identifier, database,
        database_oid, publications, created_at, began_with); for a lake from before claims, what
        its windows say of it; None for a lake nothing ever claimed or committed."""
        return _identity(self._rows(), self.slot)

    def claim(
        self,
        source: dict[str, object],
        *,
        publications: Sequence[str],
        began_with: str,
        accept_source_change: bool = False,
    ) -> dict[str, Any]:
        """Check that this lake is the lake of this slot on this server and database, and record
        it as such at its first run (or when something deliberate changed): returns the
        identity now recorded.

        Refuses, before anything is written, a lake of another slot (``LakeOfAnotherSlotError``)
        or of another server or database (``SinkFromAnotherSourceError``; with
        ``accept_source_change`` the new source is recorded instead). A database is compared by
        its OID, so a renamed one is the same source. A changed list of publications is
        recorded, and so is a ``state_deletion_vectors`` this run was given that differs from
        the recorded one (tables created from then on follow it; existing ones keep theirs, and
        a warning names those that differ). ``began_with`` is ``"snapshot"`` or ``"drain"``:
        what the run does that claims an unclaimed lake (an initial snapshot re-claims a lake
        with no commit). A lake that holds nothing but claims (a first run failed before its
        first commit) belongs to nobody yet. Claims are commits of their own app transaction,
        compare-and-set against the version the check read, so two runs claiming at once cannot
        both succeed.
        """
        self.source = dict(source)
        held, rows = self._claims_and_rows()
        recorded = _identity(rows, self.slot)
        wanted: dict[str, Any] = {
            "slot": self.slot,
            "system_identifier": source.get("system_identifier"),
            "database": source.get("database"),
            "database_oid": source.get("database_oid"),
            "timeline": source.get("timeline"),  # recorded, not compared: the drain checks it
            "publications": sorted(publications),
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "began_with": began_with,
        }
        if self.state_deletion_vectors is not None:
            wanted[STATE_VECTORS] = self.state_deletion_vectors
        if recorded is not None and recorded.get("slot") != self.slot and self._holds_nothing(rows):
            log.info("lake %s holds nothing yet (claimed by slot %r): claimed for slot %r",
                     self.root, recorded.get("slot"), self.slot)  # fmt: skip
            recorded = None
        if recorded is None:
            wanted.setdefault(STATE_VECTORS, True)
            self._commit_claim(wanted, held)
            return wanted
        if recorded.get("slot") != self.slot:
            raise LakeOfAnotherSlotError(self.root, recorded, self.slot)
        moved = any(  # what a lake from before identities does not know is not compared
            recorded.get(k) is not None and wanted[k] is not None and recorded[k] != wanted[k]
            for k in ("system_identifier", "database_oid")
        )
        if moved and not accept_source_change:
            raise SinkFromAnotherSourceError(self.slot, self.root, recorded, dict(source))
        keep = {k: recorded[k] for k in ("created_at", "began_with") if recorded.get(k)}
        if began_with == "snapshot" and self.position() is None:
            keep = {"created_at": wanted["created_at"]}  # an initial snapshot begins it again
        if STATE_VECTORS not in wanted and recorded.get(STATE_VECTORS) is not None:
            keep[STATE_VECTORS] = recorded[STATE_VECTORS]  # not asked: the lake's stays
        update = {**wanted, **keep}
        if update != recorded:
            if moved:
                log.warning("lake %s now records source %s (was %s), as asked", self.root,
                            update, recorded)  # fmt: skip
            elif recorded.get("publications") not in (None, update["publications"]):
                log.info("lake %s: publications %s (were %s)", self.root,
                         update["publications"], recorded.get("publications"))  # fmt: skip
            self._commit_claim(update, held)
        before = recorded.get(STATE_VECTORS, True)
        if update.get(STATE_VECTORS, True) != before:
            self._warn_vectors_changed(bool(update[STATE_VECTORS]))
        return update

    def _warn_vectors_changed(self, vectors: bool) -> None:
        """A changed ``state_deletion_vectors`` applies to state tables created from now on;
        say which existing ones do otherwise, and how to change them (docs/drain.md)."""
        other = [name for name in self.state_tables()
                 if (self.state_config(name)[DV_PROPERTY] == "true") != vectors]  # fmt: skip
        log.warning(
            "lake %s: state tables are created %s deletion vectors from now on "
            "(state_deletion_vectors=%s); existing state tables keep their own setting%s",
            self.root, "with" if vectors else "without", vectors,
            f", and these differ: {other} (see 'Reading the lake' in docs/drain.md to change "
            "one)" if other else "",
        )  # fmt: skip

    def check_owner(self) -> None:
        """Refuse (``LakeOfAnotherSlotError``) a lake another slot owns, reading only: what a
        run does before it judges or cleans the lake by its contents (``claim`` checks the rest
        once the source is known)."""
        rows = self._rows()
        recorded = _identity(rows, self.slot)
        mine = recorded is None or recorded.get("slot") == self.slot
        if not mine and not self._holds_nothing(rows):
            raise LakeOfAnotherSlotError(self.root, recorded or {}, self.slot)

    def _holds_nothing(self, rows: list[dict[str, Any]]) -> bool:
        """No window or snapshot of any slot committed, and no table of any kind."""
        return (
            all(r["kind"] == CLAIM for r in rows)
            and not self.changes_tables()
            and not self.state_tables()
        )

    def _commit_claim(self, identity: dict[str, Any], held: int | None) -> None:
        import pyarrow as pa

        uri = self.paths.windows()
        version = (held or 0) + 1
        row = {**_empty_row(), "kind": CLAIM, "slot": self.slot,
               "committed_at": dt.datetime.now(dt.UTC), "writer": _writer(),
               "source": json.dumps({**identity, CLAIM_KEY: version}, sort_keys=True)}  # fmt: skip
        rows = pa.Table.from_pylist([row], schema=windows_schema())
        self._upgrade_windows(uri)
        written = delta.write_file(uri, rows, prefix="claim")
        self.check_writer()
        delta.commit_files(uri, rows.schema, [written], app=LAKE_APP, expected=held,
                           version=version, name="pglogrepl windows",
                           configuration=delta.KEEP_LOGS)  # fmt: skip

    def recorded_source(self) -> dict[str, Any] | None:
        """The source identity recorded with the lake's last commit of this slot (None: none
        committed, or committed before identities were recorded)."""
        rows = self.windows()
        text = rows[-1].get("source") if rows else None
        return json.loads(text) if text else None

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
            "writer": _writer(),
            "source": json.dumps(self.source, sort_keys=True) if self.source else None,
        }
        rows = pa.Table.from_pylist([row], schema=windows_schema())
        uri = self.paths.windows()
        self._upgrade_windows(uri)
        written = delta.write_file(uri, rows, prefix=f"{int(end):016X}")
        expected = self._expected_position()
        self.check_writer()
        delta.commit_files(uri, rows.schema, [written], app=self.app, version=int(end),
                           expected=None if expected is None else int(expected),
                           name="pglogrepl windows", configuration=delta.KEEP_LOGS)  # fmt: skip
        self._position = end
        table = delta.open_table(uri)
        if table is not None and table.version() % COMPACT_EVERY == 0:
            # After the commit point: a crash here loses nothing, the next run compacts again.
            table.optimize.compact()
            table.create_checkpoint()

    def _expected_position(self) -> LSN | None:
        """The position this run last read or committed: what its next commit point must find
        in the log (another writer's commit in between makes it refused)."""
        if self._position is _UNREAD:
            return self.position()
        return self._position if isinstance(self._position, LSN) else None

    @staticmethod
    def _upgrade_windows(uri: str) -> None:
        current = delta.arrow_schema(uri)
        if current is not None and "source" not in current.names:  # a lake from before it
            delta.evolve_schema(uri, windows_schema())

    def _committed_changes(self, name: str, end: LSN) -> None:
        self._versions[name] = end
        self._covered.pop(name, None)


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

        The batch's columns get their lake names first (``lake.names``: any PostgreSQL name is
        kept, under column mapping when Delta needs it, and a name Delta would take for
        another's gets a suffix). Rows of transactions the lake already holds (a window
        drained again after a crash between two tables' commits, or changes a re-snapshot of
        the table includes) are dropped here, so a replay never duplicates a change. The
        batch's columns are checked against what the lake knows of the table before anything
        is written (``lake.evolve``).
        """
        name = table_dir(table)
        pending = self._pending.get(name)
        known = pending.schema if pending is not None else self.lake.known_schema(table)
        batch, lake_names = names.to_lake(batch, known)
        readded = self._check_order(table, known, lake_names)
        held = self.lake.covered(name)
        if held is not None and held > self.start:
            import pyarrow.compute as pc

            batch = batch.filter(pc.greater_equal(batch.column(COMMIT_LSN), int(held)))
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
        renames = names.renamed_since(known, schema)
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
        if seen in self.lake._orders_checked:
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
        self.lake._orders_checked.add(seen)
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
            current = None if table is None else delta.unmapped(_arrow(table))
            lake.check_writer()
            now = None if table is None else mapping.mapped_of(table)
            if pending.mapped is not None and table is not None and now != pending.mapped:
                # columns added or renamed, or mapping turned on, in one commit with the files
                # (delta-rs cannot change a mapped table's schema; durable: delta.put_commit)
                mapping.commit_with_schema(uri, pending.mapped, pending.files, app=lake.app,
                                           version=int(end), expected=expected)  # fmt: skip
                lake._committed_changes(name, end)
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
            lake._committed_changes(name, end)
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

    from airflow_pglogrepl.lake.quarantine import quarantine_schema

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


CLAIM = "claim"  # the kind of a windows row that records whose lake it is (``Lake.claim``)
CLAIM_KEY = "claim_version"  # in a claim's JSON: its version of ``LAKE_APP``, newest wins
# In a claim's JSON: whether the lake creates its state tables with deletion vectors (a lake
# whose claims do not say: with them, as every lake did before the option)
STATE_VECTORS = "state_deletion_vectors"
DV_PROPERTY = "delta.enableDeletionVectors"


def _identity(rows: list[dict[str, Any]], slot: str) -> dict[str, Any] | None:
    """``Lake.identity`` of the windows table's ``rows``, seen by the drain of ``slot``."""
    claims = [json.loads(r["source"]) for r in rows if r["kind"] == CLAIM]
    if claims:  # the newest: claims carry versions 1, 2, ... of their app (``LAKE_APP``)
        newest: dict[str, Any] = max(claims, key=lambda c: int(c[CLAIM_KEY]))
        return {k: v for k, v in newest.items() if k != CLAIM_KEY}
    committed = sorted((r for r in rows if r["end_lsn"]), key=lambda r: LSN(r["end_lsn"]))
    if not committed:
        return None
    slots = {r["slot"] for r in committed}
    # A lake from before claims that several slots wrote: the slot asking keeps it if it wrote
    # there (its first claim then makes it the only one), else the last writer's.
    owner = slot if slot in slots else committed[-1]["slot"]
    mine = [r for r in committed if r["slot"] == owner]
    first, last = mine[0], mine[-1]
    source = json.loads(last["source"]) if last.get("source") else {}
    return {
        "slot": owner,
        "system_identifier": source.get("system_identifier"),
        "database": source.get("database"),
        "database_oid": source.get("database_oid"),
        "timeline": source.get("timeline"),
        "publications": None,
        "created_at": str(first["committed_at"]),
        "began_with": first["kind"],
    }


def _arrow(table: Any) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def _writer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _empty_row() -> dict[str, Any]:
    return dict.fromkeys(windows_schema().names)


def _covers(current: pa.Schema, wanted: pa.Schema) -> bool:
    """Whether a table of schema ``current`` already has every column (and field) of ``wanted``,
    with the same column metadata."""
    have = dict(delta.column_types(current))
    if any(have.get(name) != kind for name, kind in delta.column_types(wanted)):
        return False
    return all((current.field(f.name).metadata or {}) == (f.metadata or {}) for f in wanted)
