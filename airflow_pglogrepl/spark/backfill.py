"""Online backfill: a table re-copied in chunks while the slot keeps being drained, for the
tables the WAL could not keep equal to the source (added to the publication holding rows, a
partition attached or detached) and the tables a user asks to resync.

Each chunk is a range of heap blocks read in a snapshot of its own (``postgres.backfill``:
nothing is locked beyond what a ``SELECT`` takes) and appended to the backfill's rows table as
one commit carrying the chunk's number, so a run killed anywhere goes on after the last chunk
that committed (``spark.backfill_chunk``). The chunks are copied, then the state is built
from them and the changelog (``spark.backfill_state``), on a thread of the backfill's own
while the drain's windows go on (``spark.backfill_build``); a run whose windows are done keeps
draining until the last chunk is copied and the lake has passed its ``high``. The state
replaces ``state/<table>`` in one Delta version: a reader sees the table as it was or whole,
never half copied, and the changelog is never written by a backfill (it stays exactly once).

A table without a key (its state is a multiset, which rows read at different times cannot
build) and a table in the lake's quarantine are re-snapshotted in one piece instead
(``spark.resnapshot``). A backfill that fails is logged and tried again at the next run; the
table stays reported meanwhile.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg

from airflow_pglogrepl.faults import fault, pause
from airflow_pglogrepl.lake import backfill as record
from airflow_pglogrepl.lake import staging
from airflow_pglogrepl.lake.coverage import Gap
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.quarantine import held
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.repair import Repair
from airflow_pglogrepl.postgres.backfill import (
    backfill_start,
    chunk_snapshot,
    heap_change,
    heap_check,
    heap_files,
)
from airflow_pglogrepl.spark.backfill_build import Builder, Found, cause_of, step_of
from airflow_pglogrepl.spark.backfill_chunk import blocks_per_chunk, write_chunk
from airflow_pglogrepl.spark.resnapshot import REPAIRED
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.postgres.backfill import ChunkSnapshot
    from airflow_pglogrepl.postgres.snapshot import SnapshotTable

__all__ = ["DEFAULT_CHUNK_ROWS", "ON_GAPS", "OnlineBackfill"]

log = logging.getLogger("airflow_pglogrepl.backfill")

DEFAULT_CHUNK_ROWS = 1_000_000  # rows a chunk reads, about (by the planner's rows per block)
ON_GAPS = ("backfill", "resnapshot", "report")
# The merge's words for a changed row whose unchanged TOAST value it has nowhere to take from: in
# a backfill, a row an UPDATE moved into a block a chunk had already read, out of one not read
# yet, so that no chunk read it. The backfill then reads the table in one snapshot instead.
UNRESOLVED = "has no earlier version to keep"
NOT_PUBLISHED = "are not published by"  # (``SnapshotReader.published_tables``)
MOVED = (
    "an UPDATE moved a row (with an unchanged TOAST value) out of a block no chunk had "
    "read yet into one a chunk had read, so no chunk holds it"
)


class _RestartError(Exception):
    """The table changed under the backfill in a way its chunks cannot follow."""


class OnlineBackfill(Repair):
    """The repair a drain run is given (``Drain(repair=...)``).

    Called with the gaps the run's coverage check found, it starts a backfill for each keyed
    table (``fallback`` re-snapshots the others) and for each table of ``resync``, and builds
    the state of every backfill ready for it; ``after_window`` starts the next step (a build
    ready, else a chunk's copy) on the backfill's thread;
    ``in_progress`` names the tables still being copied (not failures: they are reported, with
    their progress, in ``report``).
    """

    def __init__(self, *, spark: Callable[[], Any], source: Any, lake: Lake, slot: str,
                 publications: Sequence[str], fallback: Repair | None, on_gaps: str = "backfill",
                 resync: Sequence[str] = (), parity: Sequence[str] = (),
                 parity_repair: bool = False,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS) -> None:  # fmt: skip
        if chunk_rows <= 0:
            raise ValueError("chunk_rows must be positive")
        if on_gaps not in ON_GAPS:
            raise ValueError(f"on_gaps must be one of {', '.join(ON_GAPS)}, got {on_gaps!r}")
        self.spark, self.source, self.lake = spark, source, lake
        self.slot, self.publications = slot, list(publications)
        # the gaps: backfilled (the tables without a key re-snapshotted by ``fallback``), all
        # re-snapshotted by it, or only reported
        self.on_gaps = on_gaps
        self.fallback = fallback
        self.resync = [str(TableRef.parse(t)) for t in resync]
        # tables whose state is checked against the source (``spark.state_parity``), and
        # whether one found different is replaced by what the check read
        self.parity = [str(TableRef.parse(t)) for t in parity]
        self.parity_repair = parity_repair
        self.checked: dict[str, dict[str, Any]] = {}  # table -> what its check found
        self.dropped: dict[str, str] = {}  # backfills ended in this run without a state: why
        self._since: dict[str, str] = {}  # the gaps' ``since``, by table
        self.chunk_rows = chunk_rows
        self.failed: dict[str, str] = {}  # table -> why, for this run: not tried again in it
        self.built: list[str] = []  # tables whose state a backfill replaced in this run
        self._backfills: record.Backfills | None = None
        self._builder = Builder()  # the build of a copied backfill's state, off the drain's path

    # -- what the drain calls -----------------------------------------------------------------

    def __call__(self, gaps: Mapping[str, Gap]) -> dict[str, str | None]:
        """Start backfills for ``gaps`` (and ``resync``); each table: None when its state is
        whole again now, a reason when it could not be repaired, absent while in progress."""
        outcome: dict[str, str | None] = {}
        wanted = {}
        if self.on_gaps == "backfill":
            wanted = {t: g.reason for t, g in gaps.items() if g.reason in REPAIRED}
        self._since = {t: g.since for t, g in gaps.items()}
        self._begin_again_if_promoted()
        wanted.update(dict.fromkeys(self.parity, "parity"))
        wanted.update(dict.fromkeys(self.resync, "resync"))
        cannot: dict[str, str] = {}  # gaps a backfill could not begin for: re-snapshotted
        whole: dict[str, Gap] = dict(gaps)  # what the fallback may re-snapshot
        for table, why in sorted(wanted.items()):
            try:
                if self._start(table, why) or table in gaps:
                    continue
                if why == "resync":  # (no key, or in quarantine): re-snapshotted whole
                    whole[table] = Gap(table, "added", "a resync was asked for", "", "")
                else:
                    outcome[table] = ("it cannot be checked online (no key, or in the lake's "
                                      "quarantine)")  # fmt: skip
            except Exception as exc:  # the drain goes on: the table stays reported
                if table in gaps:  # (a standby has no WAL insert position to start from)
                    cannot[table] = self._failed(table, exc)
                else:
                    outcome[table] = self._failed(table, exc)
        rest = {t: g for t, g in whole.items() if t not in self._plans() and t not in outcome
                and (t not in gaps or self.on_gaps != "report")}  # fmt: skip
        if rest and self.fallback is not None:
            outcome.update(self.fallback(rest))
            for table, why in cannot.items():
                if outcome.get(table):
                    outcome[table] = f"{why}; then {outcome[table]}"
        else:
            outcome.update(cannot)
            outcome.update({t: "it cannot be resynced online (no key, or in the lake's "
                            "quarantine): re-snapshot it with snapshot_app --table"
                            for t in rest if t not in gaps})  # fmt: skip
        position = self.lake.position()
        if position is not None:
            for table in self._build_ready(position):
                outcome[table] = None
        return outcome

    def in_progress(self) -> list[str]:
        return sorted(t for t, p in self._plans().items() if p.why != "parity")

    def pending(self) -> bool:
        """Whether a backfill this run may still move on."""
        return any(t not in self.failed for t in self._plans())

    def after_window(self, end: LSN) -> None:
        """After a window committed at ``end``: take the step that ended on the backfill's
        thread, and start the next: a build ready, else a chunk's copy."""
        self._build_ready(end)
        if self._builder.busy():
            return
        for table, plan in sorted(self._plans().items()):
            if table in self.failed or plan.high is not None:
                continue
            self._builder.start(plan, end, partial(self._copy_chunk, plan), kind="chunk")
            return

    def _chunk_ended(self, plan: record.Plan, error: Exception | None, found: Found) -> None:
        """A chunk's copy ended: the last one records where the lake must reach (``high``)."""
        table = plan.table
        if isinstance(error, _RestartError):
            self._restart(plan, str(error))
        elif isinstance(error, psycopg.errors.LockNotAvailable):  # copied after a window
            log.info("%s: a lock held by another statement: the chunk waits", table)
        elif isinstance(error, ValueError) and NOT_PUBLISHED in str(error):
            self._drop(plan, f"it is no longer published ({cause_of(error)})")
        elif error is not None:
            self._failed(table, error)
        elif found is not None and found["high"] is not None:
            self._plans()[table] = dataclasses.replace(plan, high=found["high"],
                                                       chunks=found["chunks"],
                                                       files=found["files"])  # fmt: skip
            self._save()
            log.info("%s: every chunk copied; its state is built once the lake reaches %s",
                     table, found["high"])  # fmt: skip
        elif found is not None and found["files"] != plan.files:  # partitions born meanwhile
            self._plans()[table] = dataclasses.replace(plan, files=found["files"])
            self._save()

    def waiting_for(self) -> LSN | None:
        """The position the lake must reach for a copied backfill's state to be built."""
        highs = [LSN(p.high) for t, p in self._plans().items()
                 if p.high is not None and t not in self.failed]  # fmt: skip
        return min(highs) if highs else None

    def parity_report(self) -> dict[str, dict[str, Any]]:
        """The summary's ``parity``: what each check that ended in the run found."""
        return dict(self.checked)

    def report(self) -> dict[str, dict[str, Any]]:
        """The summary's ``backfills``: each in progress, how far, and why it is not moving."""
        shown: dict[str, dict[str, Any]] = {}
        for table, plan in self._plans().items():
            shown[table] = {"why": plan.why, "began": plan.began, "low": plan.low,
                            "chunks": record.chunks_done(self.lake, plan),
                            "copied": plan.high is not None}  # fmt: skip
            if table in self.failed:
                shown[table]["error"] = self.failed[table]
        for table in self.built:
            shown[table] = {"built": True}
        for table, why in self.dropped.items():
            if table not in shown:
                shown[table] = {"why": "backfill", "error": why}
        return shown

    # -- steps --------------------------------------------------------------------------------

    def _plans(self) -> dict[str, record.Plan]:
        if self._backfills is None:
            self._backfills = record.read(self.lake)
        return self._backfills.plans

    def _save(self) -> None:
        assert self._backfills is not None
        record.write(self.lake, self._backfills)

    def _timeline(self) -> int:
        """The source's timeline now (a promotion starts a new one)."""
        return int(str(self.source.source_identity()["timeline"]))

    def _begin_again_if_promoted(self) -> None:
        """Begin again, for what asked for it, each backfill begun on an earlier timeline: its
        chunks were read from the old primary in plain snapshots, which may hold rows the
        promoted standby never received."""
        now = None
        for plan in sorted(self._plans().values(), key=lambda p: p.table):
            now = self._timeline() if now is None else now
            if plan.timeline is not None and plan.timeline != now:
                why = (f"the server was promoted (timeline {plan.timeline}, now {now}): its "
                       f"chunks were read from the old primary")  # fmt: skip
                self._restart(plan, why)

    def _start(self, table: str, why: str, *, whole: bool = False) -> bool:
        """A backfill of ``table`` begun (or one going on); False: it cannot be backfilled."""
        going = self._plans().get(table)
        since = self._since.get(table) if why in REPAIRED else None
        if going is not None and (why not in REPAIRED or going.gap == since):
            return True  # (a parity check or resync asked for again: the one going on)
        if going is not None:  # a gap found since it began: the table may have been out of
            # the publication meanwhile, so its chunks and changes are not enough
            log.warning("%s: a backfill (%s) was going on when the run found it %s: it begins "
                        "again", table, going.why, why)  # fmt: skip
            self._drop(going)
        ref = TableRef.parse(table)
        if ref in held(self.lake):
            return False
        described = self._describe(ref)
        if not described.key_names or described.replica_identity in ("f", "n"):
            return False
        params = self.source.connection_params()
        start = backfill_start(params)
        step = 0 if whole else blocks_per_chunk(described, self.chunk_rows)
        plan = record.Plan(
            table=table, relid=described.relid, why=why, low=str(start.low),
            in_progress=start.in_progress, files=heap_files(params, described.relid),
            columns=tuple(c.name for c in described.columns), step=step,
            began=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), gap=since,
            repair=why == "parity" and self.parity_repair, timeline=self._timeline(),
        )  # fmt: skip
        self._plans()[table] = plan
        self._save()
        log.warning("%s: backfilling it online (%s), %s heap blocks a chunk, changes from %s; "
                    "the drain goes on", table, why, step or "all", start.low)  # fmt: skip
        return True

    def _describe(self, ref: TableRef, conn: Any = None) -> SnapshotTable:
        from airflow_pglogrepl.postgres.snapshot import SnapshotReader

        reader = SnapshotReader(self.source.connection_params())
        if conn is not None:
            return reader.published_tables(conn, self.publications, [ref])[0]
        with self.source.session() as session:
            return reader.published_tables(session, self.publications, [ref])[0]

    def _copy_chunk(self, plan: record.Plan) -> Found:
        """One chunk copied and committed to the backfill's rows (on the backfill's thread:
        the plan is the drain thread's to record, from what this returns)."""
        done = record.chunks_done(self.lake, plan)
        began = time.monotonic()
        # the lake's names before the snapshot: a rename the lake holds by then, the snapshot
        # sees (and the chunk begins again); one committed later, windows go on meanwhile
        known = self.lake.known_schema(TableRef.parse(plan.table))
        with chunk_snapshot(self.source.connection_params(), plan.relid) as chunk:
            table, files = self._check_unchanged(plan, chunk)
            first = done * plan.step
            last = plan.step == 0 or first + plan.step >= table.span
            pause("backfill_copying")
            fault("backfill_copying")
            blocks = (first, None if last else first + plan.step)
            try:
                rows = write_chunk(self.spark(), self.lake, self.source.connection_params(),
                                   plan, table, chunk.name, done, blocks, known=known)  # fmt: skip
            except Exception as exc:  # its readers failed: on a change of the columns, begin again
                if self._columns_changed(plan):
                    raise _RestartError(f"its published columns changed while a chunk was "
                                        f"copied ({cause_of(exc)})") from exc  # fmt: skip
                raise
            fault("backfill_chunk")
        log.info("%s: backfill chunk %d (blocks %d to %s%s) committed, %d rows, %.2fs",
                 plan.table, done + 1, first, "the end" if last else first + plan.step,
                 " of each leaf" if table.relkind == "p" else "", rows,
                 time.monotonic() - began)  # fmt: skip
        return {"chunks": done + 1, "high": str(chunk.high) if last else None, "files": files}

    def _columns_changed(self, plan: record.Plan) -> bool:
        try:
            described = self._describe(TableRef.parse(plan.table))
        except Exception:  # (not published any more: the next chunk says so)
            return False
        return tuple(c.name for c in described.columns) != plan.columns

    def _check_unchanged(
        self, plan: record.Plan, chunk: ChunkSnapshot
    ) -> tuple[SnapshotTable, tuple[int, ...]]:
        """The table in the chunk's snapshot, and its heap files then (those planned, and those
        of leaves born since, which the plan takes on: one of them gone begins it again)."""
        heap = heap_check(chunk.conn, plan.relid, plan.files)
        if heap.moved is not None:
            raise _RestartError(f"{heap.moved}: rows moved between the chunks")
        table = self._describe(TableRef.parse(plan.table), chunk.conn)
        if tuple(c.name for c in table.columns) != plan.columns:
            raise _RestartError("its published columns changed")
        if table.relkind == "p":  # its readers read these leaves, whatever is attached or
            # detached before they plan (one attached then detached would leave its rows)
            table = dataclasses.replace(table, leaves=heap.leaves)
        return table, heap.files

    def _build_ready(self, position: LSN) -> list[str]:
        """Take the build that ended (its table, when its state is in place), and start the
        next one ready, on the build's thread (``spark.backfill_build``)."""
        built = self._take()
        if self._builder.busy():
            return built
        for table, plan in sorted(self._plans().items()):
            if plan.high is None or LSN(plan.high) > position or table in self.failed:
                continue
            if TableRef.parse(table) in held(self.lake):  # its changes wait in quarantine
                self.failed[table] = ("waits: the table is in the lake's quarantine, so the "
                                      "changelog lacks changes its state would need")  # fmt: skip
                continue
            have = self.lake.state_version(TableRef.parse(table))
            if have is not None and have > position:  # re-snapshotted meanwhile: whole already
                log.warning("%s: its state was re-snapshotted at %s, after the backfill began: "
                            "the backfill is dropped", table, have)  # fmt: skip
                record.forget(self.lake, table)
                self._backfills = None
                continue
            try:
                moved = heap_change(self.source.connection_params(), plan.relid, plan.files)
                if moved is not None:
                    raise _RestartError(f"{moved}, after the last chunk")
                step = step_of(self.spark(), self.lake, plan, position,
                               repair=plan.repair or self.parity_repair)  # fmt: skip
            except Exception as exc:
                self._ended(plan, exc)
                continue
            self._builder.start(plan, position, step)
            break
        return built

    def settle(self, *, failed: bool = False) -> list[str]:
        """Wait for the build under way, take its outcome and end its thread (at the run's
        end: nothing of the backfill may go on writing once the run lets its lock go). After
        a failure the outcome is only logged: the next run builds the state again."""
        building = self._builder.building
        if building is not None:
            log.info("%s: the run waits for its %s to end", building.plan.table,
                     "chunk's copy" if building.kind == "chunk" else "state's build")  # fmt: skip
        try:
            if not failed:
                return self._take(None)
            ended = self._builder.outcome(None)
            if ended is not None:
                step, error = ended[0], ended[1]
                log.warning("%s: the run failed while its %s (it %s): the next run goes on "
                            "with it", step.plan.table,
                            "chunk was copied" if step.kind == "chunk" else "state was built",
                            "ended" if error is None else f"failed: {cause_of(error)}")  # fmt: skip
            return []
        finally:
            self._builder.close()

    def wait(self, seconds: float) -> None:
        self._take(seconds)

    def _take(self, timeout_s: float | None = 0.0) -> list[str]:
        """The outcome of the step that ended, handled on this (the drain's) thread; the
        tables whose state it put in place."""
        ended = self._builder.outcome(timeout_s)
        if ended is None:
            return []
        building, error, found = ended
        plan, position = building.plan, building.position
        if building.kind == "chunk":
            self._chunk_ended(plan, error, found)
            return []
        if error is not None:
            self._ended(plan, error)
            return []
        if found is not None:
            self.checked[plan.table] = found
            log.log(logging.INFO if found["equal"] else logging.WARNING,
                    "%s: parity with the source at %s: %s", plan.table, position,
                    "equal" if found["equal"] else found)  # fmt: skip
        self._finish(plan, position)
        return [plan.table]

    def _ended(self, plan: record.Plan, exc: Exception) -> None:
        """A build that could not end with a state: begun again, dropped, or failed."""
        if isinstance(exc, _RestartError):
            self._restart(plan, str(exc))
        elif UNRESOLVED in str(exc) and plan.step:
            self._restart(plan, MOVED, whole=True)
        elif UNRESOLVED in str(exc):  # the changelog itself cannot build it: said
            self._drop(plan, f"its state cannot be built: {cause_of(exc)}")
        else:
            self._failed(plan.table, exc)

    def _finish(self, plan: record.Plan, position: LSN) -> None:
        from airflow_pglogrepl.pipeline.coverage import after_snapshot

        replaced = plan.why != "parity" or bool(self.checked[plan.table].get("repaired"))
        if replaced:
            now = self.source.publication_coverage(self.publications)
            after_snapshot(self.lake, now, position, [plan.table], initial=False)
        del self._plans()[plan.table]
        self._save()
        staging.remove(record.rows_uri(self.lake, plan))
        if plan.why != "parity":
            self.built.append(plan.table)
            log.warning("%s: backfill done, its state replaced whole at %s", plan.table,
                        position)  # fmt: skip

    def _restart(self, plan: record.Plan, why: str, *, whole: bool = False) -> None:
        log.warning("%s: the backfill begins again%s: %s", plan.table,
                    ", reading the table in one snapshot" if whole else "", why)  # fmt: skip
        self._drop(plan)
        try:
            if not self._start(plan.table, plan.why, whole=whole):
                self.dropped[plan.table] = "it could not begin again (no key, or quarantined)"
        except Exception as exc:
            self.dropped[plan.table] = self._failed(plan.table, exc)

    def _drop(self, plan: record.Plan, why: str | None = None) -> None:
        """End ``plan`` without a state (``why``: said as the run's failure, else silent)."""
        assert not self._builder.busy(plan.table), "its build is under way"
        self._plans().pop(plan.table, None)
        self._save()
        staging.remove(record.rows_uri(self.lake, plan))
        if why is not None:
            self.dropped[plan.table] = why
            log.warning("%s: the backfill ends without a state: %s", plan.table, why)

    def _failed(self, table: str, exc: Exception) -> str:
        reason = f"the backfill failed: {type(exc).__name__}: {cause_of(exc)}"
        self.failed[table] = reason
        log.warning("%s: %s. It is tried again by the next run; the drain goes on", table,
                    reason, exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)  # fmt: skip
        return reason
