"""The base of the error tree: ``PgLogReplError`` and its ``retryable`` decision."""

from __future__ import annotations


class PgLogReplError(Exception):
    """Base class of every error raised by airflow-pglogrepl."""

    # Whether the same task, run again unchanged, can succeed (the condition passes by itself:
    # a busy slot, a lock, a network fault). False: a person must act first.
    retryable: bool = False
