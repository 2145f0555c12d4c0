"""The first transaction a subscriber has not applied, read from pgoutput messages.

Pure (no server): the hook peeks the subscription's slot and hands the messages here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.messages import (
    BeginMessage,
    CommitMessage,
    DeleteMessage,
    InsertMessage,
    RelationMessage,
    TruncateMessage,
    UpdateMessage,
)
from airflow_pglogrepl.pgoutput.parser import decode_message
from airflow_pglogrepl.tables import TableRef


@dataclass(frozen=True)
class PendingTransaction:
    """The first transaction the subscriber has not applied, as the publisher's slot holds it.

    ``finish_lsn`` is its commit record's LSN: what the subscriber log calls ``finished at`` and
    what ``ALTER SUBSCRIPTION ... SKIP (lsn = ...)`` takes. ``changes`` counts changes per table
    and kind (``insert``, ``update``, ``delete``, ``truncate``); ``complete`` is False when the
    peek stopped before its commit.
    """

    xid: int
    finish_lsn: LSN
    commit_time: dt.datetime
    changes: tuple[tuple[TableRef, str, int], ...]
    complete: bool = True

    @property
    def tables(self) -> tuple[TableRef, ...]:
        """The tables it changes, in the order they first appear."""
        return tuple(dict.fromkeys(table for table, _, _ in self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "xid": self.xid,
            "finish_lsn": str(self.finish_lsn),
            "commit_time": self.commit_time.isoformat(),
            "tables": [str(t) for t in self.tables],
            "changes": [{"table": str(t), "kind": k, "count": n} for t, k, n in self.changes],
            "complete": self.complete,
        }


def first_pending_transaction(
    messages: Iterable[bytes], *, applied_upto: LSN | None
) -> PendingTransaction | None:
    """The first transaction in pgoutput ``messages`` (protocol 1) not yet applied.

    A transaction is applied when its finish LSN lies before ``applied_upto`` (the origin's
    position is the end of the last applied commit record). Pure: tested without a server.
    """
    relations: dict[int, TableRef] = {}
    begin: BeginMessage | None = None
    counts: dict[tuple[TableRef, str], int] = {}

    def pending(complete: bool) -> PendingTransaction:
        assert begin is not None
        return PendingTransaction(
            xid=begin.xid,
            finish_lsn=begin.final_lsn,
            commit_time=begin.commit_ts,
            changes=tuple((t, k, n) for (t, k), n in counts.items()),
            complete=complete,
        )

    def count(relation_id: int, kind: str) -> None:
        table = relations.get(relation_id, TableRef("?", f"relation {relation_id}"))
        counts[(table, kind)] = counts.get((table, kind), 0) + 1

    for data in messages:
        message = decode_message(data)
        if isinstance(message, BeginMessage):
            begin, counts = message, {}
        elif isinstance(message, RelationMessage):
            relations[message.relation_id] = TableRef(message.namespace, message.name)
        elif isinstance(message, InsertMessage):
            count(message.relation_id, "insert")
        elif isinstance(message, UpdateMessage):
            count(message.relation_id, "update")
        elif isinstance(message, DeleteMessage):
            count(message.relation_id, "delete")
        elif isinstance(message, TruncateMessage):
            for relation_id in message.relation_ids:
                count(relation_id, "truncate")
        elif isinstance(message, CommitMessage) and begin is not None:
            if applied_upto is None or begin.final_lsn >= applied_upto:
                return pending(complete=True)
            begin = None
    if begin is not None and (applied_upto is None or begin.final_lsn >= applied_upto):
        return pending(complete=False)
    return None
