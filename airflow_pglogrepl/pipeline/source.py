"""What the drain needs of its source database: read, peek, stream and advance the slot, the
flushed WAL position, the publications and the server's identity.

``postgres.source.PgSource`` (in the Spark application's driver) and the Airflow hook have these
methods; the tests give fakes. Nothing in ``pipeline`` speaks SQL: it asks this.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from airflow_pglogrepl.exceptions import (
    SlotGoneUnderLakeError,
    SlotNotFoundError,
    StandbyNotConfirmingError,
)
from airflow_pglogrepl.lsn import LSN

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.models.records import SlotInfo
    from airflow_pglogrepl.postgres.coverage import SourceCoverage
    from airflow_pglogrepl.postgres.slot_stream import SlotStream

__all__ = ["DrainSource", "check_slot", "missing_slot", "standbys_streaming"]


class DrainSource(Protocol):
    """What the drain needs of its source database (``postgres.source.PgSource``, or the Airflow
    hook, which has the same methods): read, peek and advance the slot, and the flush LSN."""

    def get_slot(self, name: str, *, plugin: str | None = None) -> SlotInfo: ...

    # the physical slots synchronized_standby_slots names that no standby streams through
    def absent_standby_slots(self) -> list[str]: ...

    def advance_slot(self, name: str, upto: LSN | str) -> LSN: ...

    def flush_lsn(self) -> LSN: ...

    def missing_publications(self, names: Sequence[str]) -> list[str]: ...

    def publication_coverage(
        self, names: Sequence[str], *, known: Collection[int] | None = None
    ) -> SourceCoverage: ...

    def source_identity(self) -> dict[str, object]: ...

    def switch_points(self, timeline: int) -> dict[int, LSN]: ...

    def peek_changes(
        self,
        slot: str,
        *,
        upto_lsn: LSN | str | None,
        options: Mapping[str, str],
        batch_rows: int = ...,
        upto_nchanges: int | None = ...,
    ) -> Iterator[tuple[LSN, int | None, Any]]: ...

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]: ...

    def stream_slot(
        self,
        slot: str,
        *,
        start: LSN,
        options: Mapping[str, str],
        alive: Callable[[], object] | None = None,
    ) -> SlotStream: ...


def check_slot(source: DrainSource, slot_name: str, lake: Lake | None = None) -> SlotInfo:
    """The slot, if it can be drained now: exists (``missing_slot`` says why not, for ``lake``),
    pgoutput, no standby it must wait for is away (a failover slot), and
    ``verdicts.drain_refusal``."""
    from airflow_pglogrepl.models.verdicts import drain_refusal

    try:
        slot = source.get_slot(slot_name, plugin="pgoutput")
    except SlotNotFoundError:
        if lake is None:
            raise
        raise missing_slot(lake, source, slot_name) from None
    if slot.failover:  # its readers would wait, silently, for a standby that is not there
        standbys_streaming(source, slot_name)
    refusal = drain_refusal(slot)
    if refusal is not None:
        raise refusal
    return slot


def missing_slot(lake: Lake, source: DrainSource, slot: str) -> SlotNotFoundError:
    """The error for a drain whose slot does not exist: plain for a lake that holds nothing; for
    one that holds changes, ``SlotGoneUnderLakeError``, naming a promotion that lost the slot
    when the server is on a later timeline of the lake's system."""
    position = lake.position()
    if position is None:
        return SlotNotFoundError(slot)
    recorded = lake.recorded_source() or {}
    current = source.source_identity()
    old, new = recorded.get("timeline"), current.get("timeline")
    promoted = (
        recorded.get("system_identifier") == current.get("system_identifier")
        and isinstance(old, int) and isinstance(new, int) and new > old
    )  # fmt: skip
    return SlotGoneUnderLakeError(slot, lake.root, position, timeline=new, promoted=promoted)


def standbys_streaming(source: DrainSource, slot: str, committed: int = 0) -> None:
    """Refuse to read a failover slot while a standby its server waits for is away
    (``StandbyNotConfirmingError``; ``committed``: the run's windows before): the read would
    wait for it, silently, with the lake's lock held."""
    absent = source.absent_standby_slots()
    if absent:
        raise StandbyNotConfirmingError(slot, absent, committed=committed)
