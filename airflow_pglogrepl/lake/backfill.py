"""The online backfills a lake has in progress, as ``_pglogrepl/backfills`` records them, and
the chunks each has copied.

A backfill re-copies one table while the drain goes on (``spark.backfill``). What it must
remember across runs is small and fixed when it begins: where its changes start (``low``, the
transactions then in progress), the heap files it copies (a rewrite moves rows between
blocks, and the backfill then begins again), the columns, and how many heap blocks a chunk
reads. How far it got is not recorded here but in its rows table
(``LakePaths.backfill_rows``): each chunk is one append carrying the app transaction
``(lake app, chunk number)``, so a chunk either is there whole or was never written, and a
run killed anywhere goes on after the last chunk that committed.

The record is one row per version, committed compare-and-set on the slot's app transaction
under the writer lock (as ``lake.coverage`` is): the newest row holds every backfill in
progress, and a backfill leaves it once its state is built.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.slot_records import read_newest, record_schema, write_next

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

__all__ = ["Backfills", "Plan", "backfilling", "chunks_done", "forget", "read", "rows_uri", "write"]


@dataclass(frozen=True)
class Plan:
    """One table's backfill: what it copies and where its changes begin.

    ``table``: the name pgoutput sends; ``relid``: its OID; ``why``: what asked for it (a gap's
    reason, or ``"resync"``); ``low``/``in_progress``: ``postgres.backfill.BackfillStart``;
    ``files``: the heap files it copies; ``columns``: the published columns; ``step``: heap
    block numbers a chunk reads (of each leaf, for a partitioned table; 0: the table is read
    whole, in one chunk);
    ``high``: set once the last chunk is copied, the position the lake must reach before the
    state is built; ``chunks``: chunks copied (for the summary); ``gap``: the ``since`` of the
    gap it repairs; ``repair``: whether a parity check replaces a state it finds different.
    """

    table: str
    relid: int
    why: str
    low: str
    in_progress: tuple[int, ...]
    files: tuple[int, ...]
    columns: tuple[str, ...]
    step: int
    began: str  # when, as UTC ISO text
    high: str | None = None
    chunks: int = 0
    gap: str | None = None  # the gap's ``since`` it repairs: a new gap begins a new backfill
    repair: bool = False  # a parity check's: replace the state found different
    # the source's timeline when it began: on a later one (a promotion) it begins again, since
    # its chunks were read from the old primary, which nothing held back to what the standby had
    timeline: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "in_progress": list(self.in_progress),
                "files": list(self.files), "columns": list(self.columns)}  # fmt: skip

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Plan:
        return cls(**{**doc, "in_progress": tuple(doc["in_progress"]),
                      "files": tuple(doc["files"]), "columns": tuple(doc["columns"])})  # fmt: skip


@dataclass
class Backfills:
    """Every backfill in progress, by table (``version``: the record's, 0: none yet)."""

    plans: dict[str, Plan] = field(default_factory=dict)
    version: int = 0

    def document(self) -> str:
        return json.dumps({t: p.to_dict() for t, p in sorted(self.plans.items())},
                          sort_keys=True)  # fmt: skip


def _schema() -> pa.Schema:
    import pyarrow as pa

    # when, and the record (JSON: ``Backfills.document``)
    return record_schema(("recorded_at", pa.timestamp("us", tz="UTC")), ("backfills", pa.string()))


def read(lake: Lake) -> Backfills:
    """The newest record of ``lake``'s slot (empty: none yet)."""
    newest = read_newest(lake, lake.paths.backfills())
    if newest is None:
        return Backfills()
    version, row = newest
    if row is None:
        return Backfills(version=version)
    plans = {t: Plan.from_dict(p) for t, p in json.loads(row["backfills"]).items()}
    return Backfills(plans=plans, version=version)


def write(lake: Lake, backfills: Backfills) -> None:
    """Commit ``backfills`` as the newest record, if the newest is still the one it was read
    as (``backfills.version``): else ``LakeCommitConflictError``, nothing written."""
    row = {"backfills": backfills.document()}
    backfills.version = write_next(
        lake, lake.paths.backfills(), _schema(), row, made_from=backfills.version,
        name="pglogrepl backfills",
    )  # fmt: skip


def rows_uri(lake: Lake, plan: Plan) -> str:
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.tables import TableRef

    return lake.paths.backfill_rows(TableRef.parse(plan.table), int(LSN(plan.low)))


def chunks_done(lake: Lake, plan: Plan) -> int:
    """How many chunks of ``plan`` are committed in its rows table."""
    return delta.txn_version(rows_uri(lake, plan), lake.app) or 0


def backfilling(lake: Lake) -> set[str]:
    """The directory names of the tables being backfilled (a parity check aside): their state
    is rebuilt whole by the backfill, so no merge writes it meanwhile."""
    from airflow_pglogrepl.lake.layout import table_dir
    from airflow_pglogrepl.tables import TableRef

    going = read(lake).plans.values()
    return {table_dir(TableRef.parse(p.table)) for p in going if p.why != "parity"}


def forget(lake: Lake, table: str) -> bool:
    """Drop the backfill of ``table`` (a re-snapshot just replaced its state whole: the chunks
    and the changes a backfill would build from no longer make its state); whether one was."""
    from airflow_pglogrepl.lake import staging

    backfills = read(lake)
    plan = backfills.plans.pop(table, None)
    if plan is None:
        return False
    write(lake, backfills)
    staging.remove(rows_uri(lake, plan))
    return True
