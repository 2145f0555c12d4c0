"""History's columns: the contract of every ``history/<schema>.<table>`` Delta table.

A history table holds one row per version of a source row, a slowly changing dimension of type
2: the table's own columns as they were in that version, then:

=============== ============== =================================================================
column          type           meaning
=============== ============== =================================================================
_valid_from_lsn int64          commit LSN of the change that made this version; NULL for a
                               version the table already held when its history began (a
                               snapshot's row: when it was made is not known)
_valid_from_seq int64          that change's ``_seq`` (orders versions made in one transaction)
_valid_from     timestamp(UTC) that change's commit time (NULL with ``_valid_from_lsn``)
_valid_to_lsn   int64          commit LSN of the change that ended it; NULL while current
_valid_to_seq   int64          that change's ``_seq``
_valid_to       timestamp(UTC) that change's commit time
_is_current     boolean        the version is the row as it is now (``_valid_to_lsn`` is NULL)
_ended_by       string         what ended it: ``update``, ``delete``, ``key_change`` (an update
                               that gave the row another key: the row goes on under the new
                               key), ``truncate``, ``resync`` (the table was copied from the
                               source again: see below); NULL while current
=============== ============== =================================================================

The rows of the table at a lake position P (what ``state/`` held there) are the versions with
``(_valid_from_lsn IS NULL OR _valid_from_lsn < P) AND (_valid_to_lsn IS NULL OR _valid_to_lsn
>= P)``: a change at a commit LSN below P is in the lake at P. A version made and ended in one
transaction (several changes to one row) has ``_valid_from_lsn = _valid_to_lsn`` and was never
visible to any other transaction: no position shows it, ``(_valid_from_seq, _valid_to_seq)``
order it among its transaction's.

When the lake copies a table from the source again (a re-snapshot, an online backfill or a
resync: the changelog could not keep it equal to the source), the history cannot know what
happened to its rows in between. At the copy's position C every current version ends with
``resync``, and each row of the copy begins a version at C (``_valid_from_lsn = C``, negative
``_valid_from_seq`` numbering them, ``_valid_from`` NULL): never a silent jump.

Unchanged TOAST values are never NULL here: a version holds the value its row had, carried from
the version before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

VALID_FROM_LSN = "_valid_from_lsn"
VALID_FROM_SEQ = "_valid_from_seq"
VALID_FROM = "_valid_from"
VALID_TO_LSN = "_valid_to_lsn"
VALID_TO_SEQ = "_valid_to_seq"
VALID_TO = "_valid_to"
IS_CURRENT = "_is_current"
ENDED_BY = "_ended_by"

HISTORY_COLUMNS = (
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_FROM,
    VALID_TO_LSN,
    VALID_TO_SEQ,
    VALID_TO,
    IS_CURRENT,
    ENDED_BY,
)
# the columns that say where a version ends, set when it does
ENDING_COLUMNS = (VALID_TO_LSN, VALID_TO_SEQ, VALID_TO, IS_CURRENT, ENDED_BY)

UPDATE, DELETE, KEY_CHANGE, TRUNCATE = "update", "delete", "key_change", "truncate"
RESYNC = "resync"


def history_fields() -> list[pa.Field]:
    """The history columns that follow a table's own, in order (every field nullable, as the
    changelog's: Delta on Spark reads NOT NULL as an invariant)."""
    import pyarrow as pa

    stamp = pa.timestamp("us", tz="UTC")
    return [
        pa.field(VALID_FROM_LSN, pa.int64()),
        pa.field(VALID_FROM_SEQ, pa.int64()),
        pa.field(VALID_FROM, stamp),
        pa.field(VALID_TO_LSN, pa.int64()),
        pa.field(VALID_TO_SEQ, pa.int64()),
        pa.field(VALID_TO, stamp),
        pa.field(IS_CURRENT, pa.bool_()),
        pa.field(ENDED_BY, pa.string()),
    ]


def history_schema(columns: pa.Schema) -> pa.Schema:
    """A history table's schema for a table of ``columns`` (its own, without the changelog's
    metadata columns); key marks kept, so the history says its key as the changelog does."""
    import pyarrow as pa

    return pa.schema([*columns, *history_fields()])
