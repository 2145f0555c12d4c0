"""pgoutput's layouts: the bytes that say what a message, a tuple or a column is, and where the
fixed fields sit in the messages the decoders read by position.

The one definition of these bytes: the parser (``parser``, ``tuples``), the per-message decoder
(``per_message``) and the columnar one (``columnar``, ``transaction_blocks``) read them here, and
``messages.MessageType`` and ``messages.ColumnKind`` name them from here. Each constant is the
protocol byte itself, a plain ``int``: hot loops compare against them at the speed of a literal,
and numpy takes them as they are.
See https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

from typing import Final

# -- message types: a message's first byte ----------------------------------------------------

BEGIN: Final = ord("B")
COMMIT: Final = ord("C")
ORIGIN: Final = ord("O")
RELATION: Final = ord("R")
TYPE: Final = ord("Y")
INSERT: Final = ord("I")
UPDATE: Final = ord("U")
DELETE: Final = ord("D")
TRUNCATE: Final = ord("T")
MESSAGE: Final = ord("M")  # pg_logical_emit_message
# protocol 2: streaming of in-progress transactions
STREAM_START: Final = ord("S")
STREAM_STOP: Final = ord("E")
STREAM_COMMIT: Final = ord("c")
STREAM_ABORT: Final = ord("A")
# protocol 3: two-phase commit
BEGIN_PREPARE: Final = ord("b")
PREPARE: Final = ord("P")
COMMIT_PREPARED: Final = ord("K")
ROLLBACK_PREPARED: Final = ord("r")
STREAM_PREPARE: Final = ord("p")

# the messages that carry the (sub-)transaction's xid after their type byte inside a stream block
WITH_XID_IN_BLOCK: Final = (RELATION, TYPE, INSERT, UPDATE, DELETE, TRUNCATE, MESSAGE)

# -- tuple markers: which tuple follows in an Insert, Update or Delete ------------------------

NEW_TUPLE: Final = ord("N")
OLD_KEY: Final = ord("K")  # the old row's replica identity columns only
OLD_ROW: Final = ord("O")  # the whole old row (REPLICA IDENTITY FULL)

# -- TupleData column kinds: the byte before each column's value ------------------------------

KIND_NULL: Final = ord("n")
KIND_TOAST: Final = ord("u")  # an unchanged TOASTed value, not sent
KIND_TEXT: Final = ord("t")
KIND_BINARY: Final = ord("b")

# -- fixed offsets and sizes (outside stream blocks, where no xid comes first) ----------------

BEGIN_SIZE: Final = 21  # type, final LSN, commit time, xid
BEGIN_LSN: Final = 1
BEGIN_TS: Final = 9
BEGIN_XID: Final = 17
COMMIT_SIZE: Final = 26  # type, flags, commit LSN, end LSN, commit time
COMMIT_LSN: Final = 2
STREAM_COMMIT_SIZE: Final = 30  # type, xid, flags, commit LSN, end LSN, commit time
ROW_RELID: Final = 1  # Insert, Update, Delete: the relation OID,
ROW_MARKER: Final = 5  # then the first tuple marker,
ROW_TUPLE: Final = 6  # then that tuple

# 2000-01-01 (PostgreSQL's epoch for timestamps) in microseconds since 1970
PG_EPOCH_US: Final = 946_684_800_000_000
