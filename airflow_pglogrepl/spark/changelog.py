"""The changelog's metadata columns: the contract between the drain, the state merge and readers.

Every ``changes/<schema>.<table>/`` file holds the table's own columns (typed, nullable) plus:

========== ============== ======================================================================
column     type           meaning
========== ============== ======================================================================
_op        string         ``I`` insert, ``U`` update, ``D`` delete, ``T`` truncate
_commit_lsn int64         commit LSN of the transaction (order of transactions)
_seq       int64          order of the change inside its transaction, across all tables;
                          ``(_commit_lsn, _seq)`` is unique in the whole sink
_xid       int64          transaction id
_commit_ts timestamp(UTC) commit time
_unchanged array<string>  columns whose value is an unchanged TOASTed value: the column holds
                          NULL here but the row's value did not change (never a real NULL)
_old       struct         for ``U`` only, when PostgreSQL sent the old key (the key changed) or
                          the whole old row (REPLICA IDENTITY FULL): a struct with the table's
                          columns and types (only key fields set for an old key), else NULL
========== ============== ======================================================================

``D`` rows carry the old key (or the whole old row under REPLICA IDENTITY FULL) in the table's
columns; other columns are NULL. ``T`` rows have every table column NULL.
"""

from __future__ import annotations

OP = "_op"
COMMIT_LSN = "_commit_lsn"
SEQ = "_seq"
XID = "_xid"
COMMIT_TS = "_commit_ts"
UNCHANGED = "_unchanged"
OLD = "_old"

META_COLUMNS = (OP, COMMIT_LSN, SEQ, XID, COMMIT_TS, UNCHANGED, OLD)

INSERT, UPDATE, DELETE, TRUNCATE = "I", "U", "D", "T"
