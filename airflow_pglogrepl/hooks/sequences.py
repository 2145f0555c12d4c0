"""Sequence values for a cutover: logical replication does not carry them.

The subscriber's sequences stay where the schema copy left them; before the new primary takes
writes, each is set past what the publisher used (``SyncSequencesOperator`` decides by how much).
See https://www.postgresql.org/docs/15/logical-replication-restrictions.html (the statements:
``postgres/sequences.py``)
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.hooks.base import PgSessionHook
from airflow_pglogrepl.models.records import OwnedSequence, SequenceState
from airflow_pglogrepl.postgres import sequences as statements
from airflow_pglogrepl.tables import TableRef

__all__ = ["OwnedSequence", "SequenceState", "SequencesMixin"]


class SequencesMixin(PgSessionHook):
    """Sequences and the columns they feed."""

    def owned_sequences(self, tables: Sequence[TableRef]) -> list[OwnedSequence]:
        """Sequences behind identity and serial columns of ``tables`` (``pg_depend``)."""
        if not tables:
            return []
        with self.session() as conn:
            return statements.owned_sequences(conn, tables)

    def sequence_states(self, sequences: Sequence[TableRef]) -> dict[TableRef, SequenceState]:
        """``pg_sequences`` rows of ``sequences`` that exist (``last_value`` needs SELECT)."""
        if not sequences:
            return {}
        with self.session() as conn:
            return statements.sequence_states(conn, sequences)

    def column_max(self, table: TableRef, column: str) -> int | None:
        """``max(column)`` of ``table`` (an integer column), ``None`` when the table is empty."""
        with self.session() as conn:
            return statements.column_max(conn, table, column)

    def set_sequence(self, sequence: TableRef, value: int) -> None:
        """``setval(sequence, value, true)``: the next ``nextval`` returns ``value`` + increment."""
        with self.session() as conn:
            found = statements.set_sequence(conn, sequence, value)
        if not found:
            raise ObjectNotFoundError("sequence", str(sequence), "check the sequence name")
        self.log.info("setval(%s, %d)", sequence, value)
