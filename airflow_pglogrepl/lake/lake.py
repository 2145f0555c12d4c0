"""The lake of one slot: where it stands, whose it is, and the commit point of each window.

``Lake`` reads the lake's position (the version of ``_pglogrepl/windows``) and each table's
(``changes_version``, ``covered``), claims the lake for one slot and source, keeps the state
tables' settings in step with the changelog's, and commits the row that makes a window part of
the lake (``record``; what the rows of ``_pglogrepl/windows`` hold is ``lake.windows_table``'s).
Writing a window's changes is ``lake.window``'s, which also says why a crash at any point loses
nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import (
    IncompatibleSchemaChangeError,
    LakeFromAnotherSourceError,
    LakeOfAnotherSlotError,
)
from airflow_pglogrepl.lake import column_names, delta, evolve, mapping, schema_commits
from airflow_pglogrepl.lake.layout import LAKE_APP, LakePaths, app_id, table_dir
from airflow_pglogrepl.lake.windows_table import (
    CLAIM,
    STATE_VECTORS,
    claim_row,
    identity_of,
    window_row,
    windows_schema,
)
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.models.records import ColumnOrigins

# What the source's catalog says of columns the lake sees for the first time (PgSource's
# ``column_origins``): how rows from before an ``ADD COLUMN`` read it, and ``relnatts``.
Origins = Callable[[TableRef, Sequence[str]], "ColumnOrigins"]

log = logging.getLogger("airflow_pglogrepl.lake")

# Every this many versions the windows table's one-row files are compacted and its log
# checkpointed, so reading the lake's history and position stays cheap however long it runs.
COMPACT_EVERY = 100


_UNREAD = object()  # the lake's position before this object read it


class Lake:
    """One lake root as the drain of one slot sees it.

    ``writer_check`` proves the run still holds the lake's writer lock
    (``postgres.locks.WriterLock.check``); it is called before every commit this object makes,
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
        # (table, lake names) whose column order a window checked against the source this run
        self.checked_orders: set[tuple[str, tuple[str, ...]]] = set()
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
            # (setdefault: a backfill's build thread reading it must not put back an older
            # version over the one the drain's thread just committed)
            self._versions.setdefault(name, None if version is None else LSN(version))
        return self._versions[name]

    def covered(self, table: TableRef | str) -> LSN | None:
        """Below which commit LSN the lake already holds a table's changes: its changelog's
        version, or its state's when a re-snapshot put that further (the state then holds what
        the changes before it did)."""
        name = table if isinstance(table, str) else table_dir(table)
        if name not in self._covered:
            bounds = [v for v in (self.changes_version(name), self.state_version(name)) if v]
            self._covered.setdefault(name, max(bounds) if bounds else None)
        return self._covered[name]

    def floor(self, table: TableRef | str, start: LSN) -> int:
        """The commit LSN below which ``table``'s changes read from ``start`` on are in the lake
        already (0: none are): the rule by which a window drained again after a crash between
        two tables' commits, or changes a re-snapshot of the table includes, are never written
        twice. The drain applies it before it converts rows, the window again before it writes
        (``lake.window.at_or_after``)."""
        held = self.covered(table)
        return int(held) if held is not None and held > start else 0

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
        schema = column_names.to_lake(schema.empty_table(), current)[0].schema
        found = delta.open_table(uri)
        mapped = None if found is None else mapping.mapped_of(found)
        try:
            evolution = evolve.evolve(str(table), current, schema, first=f"{int(at)}:0")
            evolve.check_key(str(table), evolution, {})  # (a renamed key: restarted)
        except IncompatibleSchemaChangeError as why:
            log.warning("changelog of %s restarts at %s: %s", table, at, why)
            self.check_writer()
            schema_commits.reset_table(uri, schema, app=self.app, version=int(at))
            return "restarted"
        if not evolution.added:
            return "kept"
        self.check_writer()
        if mapped is not None or mapping.needed(evolution.schema):
            previous = mapped or mapping.mapped_schema(current, as_named=True)
            schema_commits.commit_schema(
                uri, mapping.mapped_schema(evolution.schema, previous=previous)
            )
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
        have = {f.name for f in delta.unmapped(delta.schema_of(state))}
        changes = delta.open_table(self.paths.changes(table))
        renames: dict[str, str] = {}
        if changes is not None:
            stored = delta.unmapped(delta.schema_of(changes))
            for former, now in column_names.former_names(stored).items():
                if former in have and now not in have:
                    renames[former] = now
        wanted = needed or bool(renames) or (changes is not None and mapping.is_mapped(changes))
        if wanted and not mapping.is_mapped(state):
            self.check_writer()
            schema = delta.unmapped(delta.schema_of(state))
            schema_commits.commit_schema(uri, mapping.mapped_schema(schema, as_named=True))
            log.info("state of %s is under column mapping from now on", table)
        if renames:
            self.check_writer()
            schema_commits.rename_columns(uri, renames)
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
        return identity_of(self._rows(), self.slot)

    def begun_by_a_drain(self) -> bool:
        """Whether a drain claimed this lake first (no initial snapshot: every table is whole
        from the slot's position, so some can be copied again before its first commit)."""
        return (self.identity() or {}).get("began_with") == "drain"

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
        or of another server or database (``LakeFromAnotherSourceError``; with
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
        recorded = identity_of(rows, self.slot)
        wanted: dict[str, Any] = {
            "slot": self.slot,
            "system_identifier": source.get("system_identifier"),
            "database": source.get("database"),
            "database_oid": source.get("database_oid"),
            "timeline": source.get("timeline"),  # recorded, not compared: the drain checks it
            "server_version_num": source.get("server_version_num"),  # (tells a pg_upgrade)
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
            raise LakeFromAnotherSourceError(self.slot, self.root, recorded, dict(source))
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
        recorded = identity_of(rows, self.slot)
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
        row = claim_row(self.slot, identity, version)
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

    def record(self, *, kind: str, start: LSN, end: LSN, transactions: int = 0, changes: int = 0,
               tables: dict[str, int] | None = None) -> None:  # fmt: skip
        """Commit the row that makes ``[start, end)`` part of the lake: the commit point."""
        import pyarrow as pa

        row = window_row(kind=kind, slot=self.slot, start=start, end=end,
                         transactions=transactions, changes=changes, tables=tables,
                         source=self.source)  # fmt: skip
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

    def committed_changes(self, name: str, end: LSN) -> None:
        """A window committed the changelog ``name`` (a table's directory name) up to ``end``:
        what ``changes_version`` answers from now on, without reading the log again."""
        self._versions[name] = end
        self._covered.pop(name, None)


DV_PROPERTY = "delta.enableDeletionVectors"
