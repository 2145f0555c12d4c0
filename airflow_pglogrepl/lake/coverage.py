"""What the lake holds of each published relation, as ``_pglogrepl/coverage`` records it: the
relations and leaf partitions whose every row the lake has, and the gaps, the relations whose
state the WAL alone could not keep equal to the source, until they are repaired or accepted.

Each record is one row, committed compare-and-set on the slot's app transaction in that table
(versions 1, 2, ...), under the writer lock like every commit: the newest is what the lake
holds. A record is only ever written after what it says is true (a relation is recorded whole
only when every row it ever had is in the WAL the lake drains), and a gap stays in every
record until a re-snapshot of its table or the user's acceptance takes it away, so a run that
dies anywhere leaves a record that is still true.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake.slot_records import read_newest, record_schema, write_next

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

__all__ = ["HORIZON_REFRESH", "Coverage", "Gap", "read", "write"]

HORIZON_REFRESH = 1 << 30  # transactions after which a record is written again all the same


@dataclass(frozen=True)
class Gap:
    """A relation whose state may differ from its source: which, why, what to do, and since
    when."""

    table: str
    reason: str  # "added", "attached", "detached", "removed"
    what: str
    fix: str
    since: str  # the lake's position when the run found it

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "what": self.what, "fix": self.fix, "since": self.since}


@dataclass
class Coverage:
    """Relations by OID (``table``: the name pgoutput sends, ``created``: the raw id of the
    transaction that created it, ``membership``: what published it, ``leaves``: leaf OID ->
    name), the gaps by the relation's identity (``key``: its OID and the raw id of the
    transaction that created it, so a rename keeps its gap and a reused OID does not), and
    ``horizon``: the 64-bit transaction id below which every transaction had committed when
    the record was made (a relation created at or after it is younger than the record).
    ``version``: the record's (0: none yet)."""

    relations: dict[int, dict[str, Any]] = field(default_factory=dict)
    gaps: dict[str, Gap] = field(default_factory=dict)
    version: int = 0
    horizon: int | None = None

    def holds_as(self, other: Coverage) -> bool:
        """The same relations and gaps as ``other`` (the horizon aside)."""
        return self.relations == other.relations and self.gaps == other.gaps

    def stale_against(self, other: Coverage) -> bool:
        """Not to be kept in place of ``other`` (made later): it holds something else, or its
        horizon is a quarter of the 32-bit range behind (``postgres.coverage`` reads each
        32-bit id as the nearest 64-bit one, trusted within 2^31 of the horizon)."""
        return not self.holds_as(other) or (
            (other.horizon or 0) - (self.horizon or 0) > HORIZON_REFRESH
        )

    def document(self) -> str:
        return json.dumps(
            {
                "relations": {str(oid): r for oid, r in sorted(self.relations.items())},
                "gaps": {
                    at: {**g.to_dict(), "table": g.table} for at, g in sorted(self.gaps.items())
                },
                "horizon": self.horizon,
            },
            sort_keys=True,
        )

    @classmethod
    def parse(cls, text: str, version: int) -> Coverage:
        doc = json.loads(text)
        return cls(
            relations={int(oid): r for oid, r in doc["relations"].items()},
            gaps={at: Gap(**g) for at, g in doc["gaps"].items()},
            version=version,
            horizon=doc.get("horizon"),
        )


def key(oid: int, created: object) -> str:
    """A relation's identity in the record: its OID, and who created it."""
    return f"{oid}/{created}"


def _schema() -> pa.Schema:
    import pyarrow as pa

    text, when = pa.string(), pa.timestamp("us", tz="UTC")
    # the lake's position when recorded, when, and the record (JSON: ``Coverage.document``)
    return record_schema(("position", text), ("recorded_at", when), ("coverage", text))


def read(lake: Lake) -> Coverage | None:
    """The newest record of ``lake``'s slot (None: none yet)."""
    newest = read_newest(lake, lake.paths.coverage())
    if newest is None or newest[1] is None:
        return None
    return Coverage.parse(newest[1]["coverage"], newest[0])


def write(lake: Lake, coverage: Coverage, position: str | None) -> None:
    """Commit ``coverage`` as the newest record, if the newest is still the one it was made
    from (``coverage.version``): else ``LakeCommitConflictError``, nothing written."""
    row = {"position": position, "coverage": coverage.document()}
    coverage.version = write_next(
        lake, lake.paths.coverage(), _schema(), row, made_from=coverage.version,
        name="pglogrepl coverage",
    )  # fmt: skip
