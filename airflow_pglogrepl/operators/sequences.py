"""Copy sequence positions to the subscriber before it takes writes (sequences do not replicate).

Logical replication carries the rows an identity or serial column numbered, never the sequence
behind it, so on the subscriber the sequence still stands where it was created: the first insert
after the cutover would collide with a replicated key. Each subscriber sequence is set past both
the publisher's sequence and the largest value its column holds on the subscriber.
See https://www.postgresql.org/docs/15/logical-replication-restrictions.html
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.operators.arguments import names, resolve_tables

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from airflow_pglogrepl.hooks.sequences import OwnedSequence, SequenceState
    from airflow_pglogrepl.tables import TableRef


@dataclass(frozen=True)
class SequencePlan:
    """What to do with one subscriber sequence: ``new_value`` is ``None`` when nothing changes."""

    new_value: int | None
    reason: str
    error: bool = False


def plan_sequence(
    current: SequenceState,
    *,
    publisher_last: int | None,
    column_max: int | None,
    margin: int,
) -> SequencePlan:
    """The subscriber sequence's new ``setval`` value: past everything used, never backwards.

    Target: the larger of the publisher's ``last_value`` and the owning column's maximum, plus
    ``margin``. A sequence already at or past it stays; a descending sequence is left alone
    (reported), and a target beyond ``max_value`` is an error.
    """
    if current.increment < 0:
        return SequencePlan(None, "descending sequence: not changed, set it by hand")
    used = [v for v in (publisher_last, column_max) if v is not None]
    if not used:
        return SequencePlan(None, "no value used yet on either side")
    target = max(used) + margin
    if current.last_value is not None and current.last_value >= target:
        return SequencePlan(None, f"already at {current.last_value} >= {target}")
    if target > current.max_value:
        return SequencePlan(
            None, f"target {target} is above the sequence's max_value {current.max_value}", True
        )
    if target < current.min_value:
        return SequencePlan(None, f"target {target} is below min_value {current.min_value}")
    return SequencePlan(target, f"max(publisher {publisher_last}, column {column_max}) + {margin}")


class SyncSequencesOperator(TaskBoundary, BaseOperator):
    """Set the subscriber's sequences from the publisher's, for identity and serial columns.

    For every identity or serial column of the tables (``tables`` and/or all tables of
    ``publication``, read on the publisher) the subscriber's sequence is set with ``setval`` to
    the larger of the publisher sequence's ``last_value`` (``pg_sequences``) and
    ``max(column)`` on the subscriber, plus ``margin``; a sequence is never moved backwards.
    ``sequences`` adds free-standing sequences, matched by name and set from the publisher's
    ``last_value``. Run it after the write fence and the catch-up, so no value can be taken on the
    publisher afterwards. Returns one entry per sequence with its old and new value.

    :param publisher_conn_id: Airflow connection of the publisher.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param tables: tables whose identity/serial sequences are synced.
    :param publication: sync the sequences of every table of this publication too.
    :param sequences: further sequences (``schema.name``) synced by name.
    :param margin: added to every target (room for values taken while the fence was going up).
    :param plan_only: report what would change, change nothing.
    :param publisher_database: publisher database, when not the connection's.
    :param subscriber_database: subscriber database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "tables", "publication", "sequences", "publisher_conn_id", "subscriber_conn_id",
        "publisher_database", "subscriber_database", "margin",
    )  # fmt: skip

    def __init__(
        self,
        *,
        publisher_conn_id: str,
        subscriber_conn_id: str,
        tables: str | Sequence[str] | None = None,
        publication: str | None = None,
        sequences: str | Sequence[str] | None = None,
        margin: int = 0,
        plan_only: bool = False,
        publisher_database: str | None = None,
        subscriber_database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(margin, int) and margin < 0:
            raise ValueError(f"margin must be zero or positive, not {margin}")
        if not tables and not publication and not sequences:
            raise ValueError("SyncSequencesOperator: give tables, a publication or sequences")
        self.publisher_conn_id = publisher_conn_id
        self.subscriber_conn_id = subscriber_conn_id
        self.tables = tables
        self.publication = publication
        self.sequences = sequences
        self.margin = margin
        self.plan_only = plan_only
        self.publisher_database = publisher_database
        self.subscriber_database = subscriber_database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import SequenceSyncError
        from airflow_pglogrepl.tables import parse_tables

        publisher = replication_hook(self.publisher_conn_id, self.publisher_database)
        subscriber = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        tables = (
            resolve_tables(publisher, names(self.tables), self.publication)
            if self.tables or self.publication
            else []
        )
        named = parse_tables(names(self.sequences))
        pub_owned = {(s.table, s.column): s for s in publisher.owned_sequences(tables)}
        sub_owned = subscriber.owned_sequences(tables)
        pub_states = publisher.sequence_states([s.sequence for s in pub_owned.values()] + named)
        sub_states = subscriber.sequence_states([s.sequence for s in sub_owned] + named)
        _refuse_unreadable(pub_states, sub_states)

        report: list[dict[str, Any]] = []
        errors: list[str] = []
        for owned in sub_owned:
            planned = self._plan_owned(subscriber, owned, pub_owned, pub_states, sub_states)
            self._apply(subscriber, *planned, report=report, errors=errors)
        for sequence in named:
            planned = self._plan_named(sequence, pub_states, sub_states)
            self._apply(subscriber, *planned, report=report, errors=errors)

        missing = [f"{t}.{c}" for (t, c) in pub_owned if (t, c) not in
                   {(s.table, s.column) for s in sub_owned}]  # fmt: skip
        self._log_report(report, missing)
        result = {
            "sequences": report,
            "changed": sum(1 for e in report if e["changed"]),
            "plan_only": self.plan_only,
            "columns_without_subscriber_sequence": missing,
        }
        if errors:
            context["ti"].xcom_push(key="return_value", value=result)
            raise SequenceSyncError(errors)
        return result

    def _plan_owned(
        self,
        subscriber: PgLogicalReplicationHook,
        owned: OwnedSequence,
        pub_owned: dict[tuple[TableRef, str], OwnedSequence],
        pub_states: dict[TableRef, SequenceState],
        sub_states: dict[TableRef, SequenceState],
    ) -> tuple[dict[str, Any], SequenceState | None, SequencePlan]:
        """The report entry and plan of a subscriber sequence behind an identity/serial column.

        Its publisher counterpart is the sequence behind the same table and column there.
        """
        source = pub_owned.get((owned.table, owned.column))
        pub_state = pub_states.get(source.sequence) if source else None
        publisher_last = pub_state.last_value if pub_state else None
        column_max = subscriber.column_max(owned.table, owned.column)
        entry = {
            "sequence": str(owned.sequence),
            "table": str(owned.table),
            "column": owned.column,
            "kind": owned.kind,
            "publisher_sequence": str(source.sequence) if source else None,
            "publisher_last_value": publisher_last,
            "subscriber_column_max": column_max,
        }
        state = sub_states.get(owned.sequence)
        if state is None:
            return entry, None, SequencePlan(None, "sequence not readable", True)
        plan = plan_sequence(
            state, publisher_last=publisher_last, column_max=column_max, margin=self.margin
        )
        return entry, state, plan

    def _plan_named(
        self,
        sequence: TableRef,
        pub_states: dict[TableRef, SequenceState],
        sub_states: dict[TableRef, SequenceState],
    ) -> tuple[dict[str, Any], SequenceState | None, SequencePlan]:
        """The report entry and plan of a free-standing sequence, matched by name on both sides."""
        pub_state, state = pub_states.get(sequence), sub_states.get(sequence)
        entry = {"sequence": str(sequence), "table": None, "column": None, "kind": "named",
                 "publisher_sequence": str(sequence),
                 "publisher_last_value": pub_state.last_value if pub_state else None,
                 "subscriber_column_max": None}  # fmt: skip
        if pub_state is None or state is None:
            side = "publisher" if pub_state is None else "subscriber"
            return entry, state, SequencePlan(None, f"sequence missing on the {side}", True)
        plan = plan_sequence(
            state, publisher_last=pub_state.last_value, column_max=None, margin=self.margin
        )
        return entry, state, plan

    def _apply(
        self,
        subscriber: PgLogicalReplicationHook,
        entry: dict[str, Any],
        state: SequenceState | None,
        plan: SequencePlan,
        *,
        report: list[dict[str, Any]],
        errors: list[str],
    ) -> None:
        """Carry out ``plan`` (``setval`` unless ``plan_only``) and record it in ``report``."""
        entry.update(old_value=state.last_value if state else None, new_value=None,
                     changed=False, reason=plan.reason)  # fmt: skip
        if plan.new_value is not None and state is not None:
            if not self.plan_only:
                subscriber.set_sequence(state.sequence, plan.new_value)
            entry.update(new_value=plan.new_value, changed=not self.plan_only)
        if plan.error:
            errors.append(f"{entry['sequence']}: {plan.reason}")
        report.append(entry)

    def _log_report(self, report: list[dict[str, Any]], missing: list[str]) -> None:
        for entry in report:
            self.log.info(
                "%s: %s -> %s (%s)", entry["sequence"], entry["old_value"],
                entry["new_value"] if entry["new_value"] is not None else "unchanged",
                entry["reason"],
            )  # fmt: skip
        if missing:
            self.log.warning(
                "Columns with a sequence on the publisher but none on the subscriber (their next "
                "values come from elsewhere there): %s",
                ", ".join(missing),
            )


def _refuse_unreadable(
    pub_states: dict[TableRef, SequenceState], sub_states: dict[TableRef, SequenceState]
) -> None:
    """Refuse, before anything is set, when the roles may not read a sequence's ``last_value``.

    Without the privilege ``pg_sequences`` reads NULL, as for a sequence never used: the plan
    would take it for unused, and aim too low (publisher) or move the sequence back (subscriber).
    """
    from airflow_pglogrepl.exceptions import SequenceSyncError

    unreadable = [
        f"{side} sequence {state.sequence}: this role may not read its last_value (it "
        f"reads NULL, as for a sequence never used); GRANT SELECT ON SEQUENCE "
        f"{state.sequence} to the {side} connection's role"
        for side, states in (("publisher", pub_states), ("subscriber", sub_states))
        for state in states.values()
        if not state.readable
    ]
    if unreadable:
        raise SequenceSyncError(unreadable, refused=True)
