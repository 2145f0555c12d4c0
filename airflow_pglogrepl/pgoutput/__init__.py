"""pgoutput's binary messages, decoded.

Pure code (no Airflow, no psycopg), so it runs inside Spark executors and is tested without a
server. The drain feeds the rows it peeks from a slot to ``PgOutputStream`` and gets
``TransactionBegin``, ``Change``, ``LogicalMessage`` and ``TransactionCommit`` records in commit
order; ``decode_message`` parses a single message.
"""

from __future__ import annotations

from airflow_pglogrepl.pgoutput.buffer import InMemoryTransactionBuffer, TransactionBuffer
from airflow_pglogrepl.pgoutput.changes import (
    Change,
    Event,
    LogicalMessage,
    TransactionBegin,
    TransactionCommit,
)
from airflow_pglogrepl.pgoutput.messages import UNCHANGED_TOAST, MessageType, PgOutputMessage
from airflow_pglogrepl.pgoutput.parser import decode_message
from airflow_pglogrepl.pgoutput.per_message import PgOutputStream
from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.values import Interval

__all__ = [
    "UNCHANGED_TOAST",
    "Change",
    "ColumnInfo",
    "Event",
    "InMemoryTransactionBuffer",
    "Interval",
    "LogicalMessage",
    "MessageType",
    "PgOutputMessage",
    "PgOutputStream",
    "TableInfo",
    "TransactionBegin",
    "TransactionBuffer",
    "TransactionCommit",
    "decode_message",
]
