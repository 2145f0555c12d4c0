"""Each run's comparison of what the publications cover now with what the lake holds
(``lake.coverage``): a difference the WAL does not carry is never silent.

The WAL carries no change for the rows a table held before it was published (``ALTER
PUBLICATION ... ADD TABLE``), for the rows a partition held before it was attached to a root
published via its root, nor for the rows that leave a root's state when a partition is
detached or dropped. A run finds each of them here, before it reads the slot, by comparing
relations and leaf partitions by OID with the lake's record; one born published (created
already in the publication: ``postgres.coverage``) has every row in the WAL and is no gap. A
gap stays recorded, and reported by every run, until a re-snapshot of the table takes it away
or the user accepts it (``accept``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake import coverage as record
from airflow_pglogrepl.lake.coverage import Coverage, Gap, key
from airflow_pglogrepl.tables import TableRef

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.pipeline.source import DrainSource
    from airflow_pglogrepl.postgres.coverage import PublishedRelation, SourceCoverage

__all__ = [
    "REASONS",
    "WARN_ONLY",
    "CoverageCheck",
    "accepted",
    "after_snapshot",
    "judge",
    "repaired",
]

log = logging.getLogger("airflow_pglogrepl.drain")

# Gaps that leave the lake behind its source by the user's own act, not wrong: reported, never
# a failed task. A table no longer published keeps its lake tables as they were.
WARN_ONLY = frozenset({"removed"})
REASONS = frozenset({"added", "attached", "detached", "removed"})


def _fix(table: str, reason: str) -> str:
    quoted = shlex.quote(table)
    keep = (
        "; to keep its rows as history instead, accept it"
        if reason == "detached"
        else ", or accept the difference"
    )
    return (
        f"re-snapshot it (a drain with on_incomplete='resnapshot' does it itself; or "
        f"InitialSnapshotOperator(tables=[{table!r}], ...) or snapshot_app --table {quoted} "
        f"while no drain of the lake runs){keep}: SlotDrainOperator(accept_incomplete="
        f"[{f'{table}:{reason}'!r}]) or drain_app --accept-incomplete "
        f"{shlex.quote(f'{table}:{reason}')}"
    )


def _entry(relation: PublishedRelation) -> dict[str, Any]:
    leaves = {str(oid): str(leaf.table) for oid, leaf in sorted(relation.leaves.items())}
    return {"table": str(relation.table), "created": relation.created_raw,
            "membership": list(relation.membership), "leaves": leaves}  # fmt: skip


def _put(coverage: Coverage, at: str, gap: Gap) -> None:
    """Record ``gap``: a gap found before stays (its ``since``), unless it only warned and
    this one fails the run."""
    before = coverage.gaps.get(at)
    if before is None or (before.reason in WARN_ONLY and gap.reason not in WARN_ONLY):
        coverage.gaps[at] = gap


def judge(
    recorded: Coverage | None,
    now: SourceCoverage,
    since: str,
    snapshot_tables: Iterable[str] | None = None,
) -> Coverage:
    """The lake's coverage after this run found ``now``: the relations as they are, and the
    gaps recorded before with those found now.

    A relation or leaf new to the record is whole only if it was created after the record
    was made (its horizon) and published from its creation. Without a record, the lake's
    initial snapshot (``snapshot_tables``) says which relations it holds whole; a lake
    without either takes what is published now as whole (it began with its slot)."""
    coverage = Coverage(relations={r.oid: _entry(r) for r in now.relations},
                        gaps=dict(recorded.gaps) if recorded else {},
                        version=recorded.version if recorded else 0,
                        horizon=now.horizon)  # fmt: skip
    if recorded is None:
        copied = None if snapshot_tables is None else set(snapshot_tables)
        for relation in now.relations:
            if copied is not None and str(relation.table) not in copied:
                _new_relation(coverage, relation, None, since)
        return coverage
    for relation in now.relations:
        before = recorded.relations.get(relation.oid)
        if before is not None and before.get("created") != relation.created_raw:
            before = None  # the OID of a dropped relation, given to a new one
        if before is None:
            _new_relation(coverage, relation, recorded.horizon, since)
        elif not set(before.get("membership", ())) <= set(relation.membership):
            _put(coverage, key(relation.oid, relation.created_raw), _gap(relation, "added", (
                f"{relation.table} was removed from the publication and published again: "
                f"the WAL carries none of its changes in between"), since))  # fmt: skip
        else:
            _changed_leaves(coverage, relation, before, recorded.horizon, since)
    _removed(coverage, recorded, now, since)
    _renamed(coverage, now)
    return coverage


def _renamed(coverage: Coverage, now: SourceCoverage) -> None:
    """A gap of a relation renamed since: shown, fixed and repaired under its name now."""
    for relation in now.relations:
        at = key(relation.oid, relation.created_raw)
        gap = coverage.gaps.get(at)
        if gap is not None and gap.table != str(relation.table):
            table = str(relation.table)
            coverage.gaps[at] = dataclasses.replace(gap, table=table, fix=_fix(table, gap.reason))


def _gap(relation: PublishedRelation, reason: str, what: str, since: str) -> Gap:
    table = str(relation.table)
    return Gap(table, reason, what, _fix(table, reason), since)


def _removed(coverage: Coverage, recorded: Coverage, now: SourceCoverage, since: str) -> None:
    published = {(r.oid, r.created_raw) for r in now.relations}
    for oid, before in recorded.relations.items():
        if (oid, before.get("created")) in published:
            continue
        table = before["table"]
        _put(coverage, key(oid, before.get("created")), Gap(
            table,
            "removed",
            f"{table} is no longer published (or was dropped): its lake tables keep what they "
            f"held and follow none of its changes",
            f"publish it again (it is then copied again), or accept it: "
            f"SlotDrainOperator(accept_incomplete=[{table + ':removed'!r}]) or drain_app "
            f"--accept-incomplete {shlex.quote(table + ':removed')}",
            since,
        ))  # fmt: skip


def _new_relation(
    coverage: Coverage, relation: PublishedRelation, horizon: int | None, since: str
) -> None:
    young = horizon is not None and relation.created >= horizon
    published_then = relation.published is None or relation.published <= relation.created
    held_rows = sorted(str(leaf.table) for leaf in relation.leaves.values()
                       if not leaf.linked_then)  # fmt: skip
    if young and published_then and relation.linked_then and not held_rows:
        return  # created published: every row it had is in the WAL
    what = (
        f"{relation.table} became published holding rows the WAL never carried (added to "
        f"the publication, moved into a published schema, or a partition attached, after it "
        f"was created; or the drain's publications changed)"
    )
    if held_rows and young and published_then and relation.linked_then:
        what = (f"{relation.table} was published at its creation, but partitions were attached "
                f"to it holding rows the WAL never carried: {', '.join(held_rows)}")  # fmt: skip
    _put(coverage, key(relation.oid, relation.created_raw), _gap(relation, "added", what, since))


def _changed_leaves(
    coverage: Coverage,
    relation: PublishedRelation,
    before: dict[str, Any],
    horizon: int | None,
    since: str,
) -> None:
    had = {int(o): n for o, n in before["leaves"].items()}
    attached = sorted(
        str(leaf.table)
        for oid, leaf in relation.leaves.items()
        if oid not in had
        and not (horizon is not None and leaf.created >= horizon and leaf.linked_then)
    )
    gone = sorted(name for oid, name in had.items() if oid not in relation.leaves)
    if attached:
        _put(coverage, key(relation.oid, relation.created_raw), _gap(relation, "attached", (
            f"partitions were attached to {relation.table} holding rows the WAL never "
            f"carried: {', '.join(attached)}; its state lacks them"), since))  # fmt: skip
    if gone:
        _put(coverage, key(relation.oid, relation.created_raw), _gap(relation, "detached", (
            f"partitions of {relation.table} were detached or dropped: {', '.join(gone)}; "
            f"the WAL carries no delete for their rows, which its state still holds"),
            since))  # fmt: skip


def repaired(coverage: Coverage, tables: Iterable[str], now: SourceCoverage) -> bool:
    """After a re-snapshot of ``tables``: their gaps taken away and their relations recorded
    as the copy found them. Whether anything changed."""
    names = set(tables)
    before = coverage.document()
    for relation in now.relations:
        if str(relation.table) in names:
            coverage.relations[relation.oid] = _entry(relation)
            coverage.gaps.pop(key(relation.oid, relation.created_raw), None)
    return coverage.document() != before


def accepted(coverage: Coverage, accept: Iterable[str]) -> list[str]:
    """Take away the gaps ``accept`` names (``table`` or ``table:reason``); what was taken."""
    taken = []
    for item in accept:
        name, _, reason = item.rpartition(":")
        if reason not in REASONS:
            name, reason = item, ""
        table = str(TableRef.parse(name))
        for at, gap in list(coverage.gaps.items()):
            if gap.table == table and reason in ("", gap.reason):
                del coverage.gaps[at]
                taken.append(f"{table} ({gap.reason})")
    return taken


def after_snapshot(
    lake: Lake, now: SourceCoverage, point: LSN, copied: Sequence[str], *, initial: bool
) -> None:
    """What the lake holds whole after a snapshot at ``point``: after an initial one, the
    relations it ``copied`` (one published meanwhile is not); after a re-snapshot, the
    ``copied`` tables as well, whose gaps it repaired."""
    recorded = record.read(lake)
    if initial:
        whole = judge(None, now, str(point), snapshot_tables=copied)
        whole.version = recorded.version if recorded is not None else 0
        record.write(lake, whole, str(point))
    elif recorded is not None and repaired(recorded, copied, now):
        position = lake.position()
        record.write(lake, recorded, None if position is None else str(position))
        log.info("the lake holds %s whole again: no longer reported incomplete",
                 ", ".join(copied))  # fmt: skip


def known(recorded: Coverage | None) -> set[int] | None:
    """The relations and leaves (OIDs) ``recorded`` holds; None without a record (a lake's
    first check takes its snapshot, or what is published, as whole)."""
    if recorded is None:
        return None
    leaves = {int(oid) for r in recorded.relations.values() for oid in r.get("leaves", {})}
    return set(recorded.relations) | leaves


@dataclass
class CoverageCheck:
    """A run's check: compare, record what changed, log every gap, and say which remain
    (by table name)."""

    source: DrainSource
    lake: Lake
    publications: Sequence[str]
    accept: Sequence[str] = ()
    gaps: dict[str, Gap] = field(default_factory=dict)

    def run(self) -> dict[str, Gap]:
        from airflow_pglogrepl.lake.snapshots import existing_snapshot

        recorded = record.read(self.lake)
        now = self.source.publication_coverage(self.publications, known=known(recorded))
        position = self.lake.position()
        since = str(position) if position is not None else "the lake's start"
        snapshot = existing_snapshot(self.lake) if recorded is None else None
        tables = None
        if snapshot is not None:
            tables = list(json.loads(snapshot["tables"] or "{}"))
        coverage = judge(recorded, now, since, tables)
        taken = accepted(coverage, self.accept)
        for each in taken:
            log.warning("%s: the difference from its source is accepted as asked; the lake "
                        "no longer reports it", each)  # fmt: skip
        if self.accept and not taken:
            log.warning("accept_incomplete %s matched no table the lake reports (write "
                        "schema.table or schema.table:reason, reason one of %s)",
                        list(self.accept), ", ".join(sorted(REASONS)))  # fmt: skip
        if recorded is None or recorded.stale_against(coverage):
            record.write(self.lake, coverage, None if position is None else str(position))
        for gap in sorted(coverage.gaps.values(), key=lambda g: g.table):
            log.warning("%s: %s (since %s). Fix: %s", gap.table, gap.what, gap.since, gap.fix)
        # one per name, the one that fails the run first (a table dropped and made again)
        ranked = sorted(coverage.gaps.values(), key=lambda g: g.reason not in WARN_ONLY)
        self.gaps = {gap.table: gap for gap in ranked}
        return self.gaps
