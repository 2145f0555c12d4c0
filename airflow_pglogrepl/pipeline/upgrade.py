"""Whether the source is the lake's server after ``pg_upgrade``, asked only when the user said
so (``accept_source_change``): nothing on a server proves it was upgraded, so every fact that
an upgrade keeps is checked, and the lake's record of its relations is carried over.

``pg_upgrade`` (from 17) carries a logical slot over only when the slot has consumed all its
WAL, and creates it again at the new cluster's WAL position, past the old one's end, on a new
system identifier. It keeps the database's OID and every relation's OID, not the transaction
that created each relation (the schema is restored by new transactions). So: a later major,
from 17 or later, the same database by name and OID, and every relation the lake's coverage
record holds published under the same OID and name. The record is then re-keyed to the new
creating and publishing transactions, or every later run would find each relation removed and
published again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_pglogrepl.lake import coverage as record
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.pipeline.source import DrainSource

if TYPE_CHECKING:
    from airflow_pglogrepl.postgres.coverage import PublishedRelation

__all__ = ["carried_over"]

log = logging.getLogger("airflow_pglogrepl.drain")

SLOTS_KEPT_FROM = 17  # pg_upgrade keeps logical slots from this major on


def carried_over(
    lake: Lake, source: DrainSource, publications: Sequence[str], recorded: dict[str, object],
    current: dict[str, object],
) -> str | None:  # fmt: skip
    """None when the source is the lake's server after ``pg_upgrade`` (the coverage record
    then re-keyed), else why it is not taken for one."""
    old, new = recorded.get("server_version_num"), current.get("server_version_num")
    if not isinstance(old, int) or not isinstance(new, int):
        return "the lake recorded no server version to compare (a lake from before they were)"
    if old // 10000 < SLOTS_KEPT_FROM:
        return (f"the lake's server ran PostgreSQL {old // 10000}, and pg_upgrade keeps logical "
                f"slots only from {SLOTS_KEPT_FROM}: this slot was made after it")  # fmt: skip
    if new // 10000 <= old // 10000:
        return f"the server runs PostgreSQL {new // 10000}, not a later major than the lake's"
    for field in ("database", "database_oid"):
        if recorded.get(field) is None or recorded.get(field) != current.get(field):
            return f"its {field} is {current.get(field)!r}, the lake's {recorded.get(field)!r}"
    coverage = record.read(lake)
    if coverage is None or not coverage.relations:
        return "the lake records no relations whose OIDs pg_upgrade would have kept"
    now = {r.oid: r for r in source.publication_coverage(publications).relations}
    for oid, entry in sorted(coverage.relations.items()):
        relation = now.get(oid)
        if relation is None or str(relation.table) != entry.get("table"):
            return (f"{entry.get('table')} (OID {oid}) is not published there under that OID "
                    f"and name, as pg_upgrade keeps them")  # fmt: skip
    _rekey(lake, coverage, now)
    return None


def _rekey(lake: Lake, coverage: record.Coverage, now: dict[int, PublishedRelation]) -> None:
    """The record with each relation's creating transaction, and the transactions that
    published it, as the upgraded server has them; its gaps under the new keys."""
    relations = {oid: {**entry, "created": now[oid].created_raw,
                       "membership": list(now[oid].membership)}
                 for oid, entry in coverage.relations.items()}  # fmt: skip
    moved = {record.key(oid, entry.get("created")): record.key(oid, now[oid].created_raw)
             for oid, entry in coverage.relations.items()}  # fmt: skip
    gaps = {moved.get(at, at): gap for at, gap in coverage.gaps.items()}
    rekeyed = dataclasses.replace(coverage, relations=relations, gaps=gaps)
    position = lake.position()
    record.write(lake, rekeyed, None if position is None else str(position))
    log.info("lake %s: its record of %d relations carried over to the upgraded server",
             lake.root, len(relations))  # fmt: skip
