"""Timelines: where a promoted server's history left the one a lake was drained on.

A promotion starts a new timeline at the LSN where the standby's replay ended, the switch point.
WAL past that point on the old timeline never happened on the promoted server: a change the old
primary committed there, and a drain stored, is not in the new server's history, and the new
server's own commits take LSNs at and after the switch point. So a lake drained from the old
primary continues on the promoted server only if the lake holds nothing past the switch point.

``TIMELINE_HISTORY`` (a replication command) returns a timeline's history file: one line per
ancestor timeline, ``<timeline> <tab> <switch LSN> <tab> <reason>``, oldest first. Timeline 1
has no history. See https://www.postgresql.org/docs/17/protocol-replication.html and
https://www.postgresql.org/docs/17/continuous-archiving.html#BACKUP-TIMELINES
"""

from __future__ import annotations

from psycopg import sql

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.connect import Conn

__all__ = ["parse_history", "switch_points"]


def parse_history(content: str) -> dict[int, LSN]:
    """Each ancestor timeline of a history file, with the LSN where it was left. Comment and
    blank lines are skipped, as the server's own reader does."""
    switches: dict[int, LSN] = {}
    for line in content.splitlines():
        fields = line.strip().split("\t")
        if not fields[0] or fields[0].startswith("#"):
            continue
        if len(fields) < 2 or not fields[0].isdigit():
            raise ValueError(f"not a timeline history line: {line!r}")
        switches[int(fields[0])] = LSN(fields[1].strip())
    return switches


def switch_points(conn: Conn, timeline: int) -> dict[int, LSN]:
    """The ancestors of ``timeline`` on the server of the replication connection ``conn``,
    each with the LSN where the history left it (none for timeline 1)."""
    if timeline <= 1:
        return {}
    row = conn.execute(sql.SQL("TIMELINE_HISTORY {}").format(sql.Literal(timeline))).fetchone()
    assert row is not None, "TIMELINE_HISTORY returns one row"
    content = row["content"]  # bytea: bytes through psycopg
    if isinstance(content, bytes | bytearray | memoryview):
        content = bytes(content).decode()
    return parse_history(str(content))
