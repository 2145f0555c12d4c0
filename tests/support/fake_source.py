"""A source without a server for the drain loop's tests: a slot over encoded pgoutput rows that
can be peeked (``peek_changes``, ``peek_arrow``) or streamed (``FakeStream``), and records
where it was advanced or confirmed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_pglogrepl.exceptions import (
    ArrowPeekError,
    SlotNotFoundError,
    SlotStreamUnavailableError,
)
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import SlotInfo


class FakeSource:
    """A slot over a fixed list of peek rows; records every advance. Its ``restart_lsn`` follows
    the slot's position, or stays at ``restart`` when given (a transaction left open pins it)."""

    def __init__(self, rows: list[tuple[LSN, int | None, bytes]], confirmed: int, flush: int,
                 restart: int | None = None):  # fmt: skip
        self.rows = rows
        self.pinned = restart is not None
        self.streamed: list[FakeStream] = []
        self.slot = SlotInfo(
            name="s", plugin="pgoutput", slot_type="logical", database="db", temporary=False,
            active=False, active_pid=None,
            restart_lsn=LSN(confirmed if restart is None else restart),
            confirmed_flush_lsn=LSN(confirmed), wal_status="reserved", safe_wal_size=None,
            two_phase=False, retained_bytes=0, current_lsn=LSN(flush), inactive_since=None,
        )  # fmt: skip
        self.flush = LSN(flush)
        self.advances: list[LSN] = []
        self.dropped_publications: set[str] = set()
        self.gone = False  # the slot does not exist (dropped, or lost in a promotion)

    def get_slot(self, name: str, *, plugin: str | None = None) -> SlotInfo:
        if self.gone:
            raise SlotNotFoundError(name)
        return self.slot

    def advance_slot(self, name: str, upto: LSN | str) -> LSN:
        self.advances.append(LSN(upto))
        self.slot = dataclasses.replace(self.slot, confirmed_flush_lsn=LSN(upto))
        if not self.pinned:
            self.slot = dataclasses.replace(self.slot, restart_lsn=LSN(upto))
        return LSN(upto)

    def flush_lsn(self) -> LSN:
        return self.flush

    def missing_publications(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if n in self.dropped_publications]

    def publication_coverage(self, names: Sequence[str], *, known: Any = None) -> Any:
        from airflow_pglogrepl.postgres.coverage import SourceCoverage

        return SourceCoverage(horizon=0, relations=list(self.relations))

    relations: list[Any] = []  # what publication_coverage finds published (none by default)

    def source_identity(self) -> dict[str, object]:
        return dict(self.identity)

    identity: dict[str, object] = {"system_identifier": "7", "timeline": 1, "database": "db"}
    # the current timeline's ancestors, each with where its history left it (a promotion's)
    switches: dict[int, LSN] = {}

    absent: list[str] = []  # synchronized_standby_slots no standby streams through

    def absent_standby_slots(self) -> list[str]:
        return list(self.absent)

    def switch_points(self, timeline: int) -> dict[int, LSN]:
        assert timeline == self.identity["timeline"], "asked of the current timeline"
        return dict(self.switches)

    def peek_changes(
        self, slot: str, *, upto_lsn: LSN | str | None, options: Mapping[str, str],
        batch_rows: int = 5000, upto_nchanges: int | None = None,
    ) -> Iterator[tuple[LSN, int | None, Any]]:  # fmt: skip
        start = self.slot.confirmed_flush_lsn
        assert start is not None and upto_lsn is not None
        yield from (r for r in self.rows if start <= r[0] < LSN(upto_lsn))

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]:
        import pyarrow as pa

        if self.arrow_fails:
            raise ArrowPeekError("ADBC is not here")
        rows = [r[2] for r in self.peek_changes(slot, upto_lsn=upto_lsn, options=options)]
        step = self.batch_messages
        for first in range(0, len(rows), step):  # small batches: transactions span them
            yield pa.array(rows[first : first + step], pa.binary())

    arrow_fails = False
    batch_messages = 2

    # whether stream_slot streams (FakeStream) or is refused, as by a role without REPLICATION
    streams = False
    stream_ends_unclean = False  # the stream's close finds it ended on its own
    ticks = 0  # the idle ticks a following run's stream gave

    def stream_slot(self, slot: str, *, start: LSN, options: Mapping[str, str],
                    alive: Any = None) -> Any:  # fmt: skip
        if not self.streams:
            raise SlotStreamUnavailableError(slot, "this fake is peeked")
        return FakeStream(self, start, dict(options))


class FakeStream:
    """A walsender over the fake's rows: every message from ``start`` on (past the run's end
    too, as a server does), ``batch_messages`` at a time, then a keepalive at the flush
    position. A batch's WAL end is its highest frame's, as a server's: a Commit's frame holds
    where its record ends, every other message's frame its own LSN (a change's is below its
    transaction's commit). Confirms land on the slot when closed."""

    def __init__(self, source: FakeSource, start: LSN, options: dict[str, str]) -> None:
        self.source = source
        self.start = start
        self.options = options  # what a server takes: the drain's decoder reads them
        self.confirms: list[LSN] = []
        source.streamed.append(self)

    def batches(self) -> Iterator[Any]:
        return self._sent([r for r in self.source.rows if r[0] >= self.start])

    def _sent(self, rows: list[tuple[LSN, int | None, bytes]]) -> Iterator[Any]:
        """``rows`` as the walsender's batches, ``batch_messages`` at a time, then a keepalive
        at the flush position."""
        import pyarrow as pa

        step = self.source.batch_messages
        for first in range(0, len(rows), step):
            part = rows[first : first + step]
            ends = [max(int(r[0]), _commit_end(r[2])) for r in part]
            yield _Batch(pa.array([r[2] for r in part], pa.large_binary()), LSN(max(ends)))
        yield _Batch(pa.array([], pa.large_binary()), self.source.flush)

    def batches_or_idle(self, idle_s: float | None) -> Iterator[Any]:
        """``batches``, then a tick (None) at every call from then on, as a quiet server's."""
        yield from self.batches()
        while True:
            self.source.ticks += 1
            yield None

    def confirm(self, lsn: LSN | int) -> None:
        self.confirms.append(LSN(lsn))

    def close(self) -> bool:
        if self.source.stream_ends_unclean:  # the walsender went away: confirms went nowhere
            return False
        if self.confirms:
            confirmed = max(self.confirms)
            self.source.slot = dataclasses.replace(self.source.slot, confirmed_flush_lsn=confirmed)
        return True


def _commit_end(message: bytes) -> int:
    """A Commit message's end LSN (``C``, flags, commit LSN, end LSN, ...); 0 for others."""
    return int.from_bytes(message[10:18], "big") if message[:1] == b"C" else 0


@dataclasses.dataclass
class _Batch:
    messages: Any
    wal_end: LSN


class ServerStream(FakeStream):
    """A walsender as a server's is, for rows whose LSNs are a server's (each transaction's
    messages before its commit LSN): the Relations first, then every message of each transaction
    whose commit is at or past ``start``, whole, however far back its first message lies."""

    def batches(self) -> Iterator[Any]:
        relations, rows, final = [], [], None
        for row in self.source.rows:
            if row[2][:1] == b"R":
                relations.append(row)
                continue
            if row[2][:1] == b"B":
                final = int.from_bytes(row[2][1:9], "big")
            if final is not None and final >= int(self.start):
                rows.append(row)
            if row[2][:1] == b"C":
                final = None
        return self._sent(relations + rows)
