"""A slot's changes as Arrow batches, fetched in C by ADBC (``adbc-driver-postgresql``).

``peek_changes`` (psycopg) hands over one Python ``bytes`` object per message. ADBC runs the
same ``pg_logical_slot_peek_binary_changes`` as ``COPY ... (FORMAT binary)`` and parses the
result in C into Arrow record batches: the messages arrive as one ``binary`` column, a single
buffer plus offsets, which the columnar decoder reads without a Python object per message.

The session (``adbc.adbc_session``) is set up as psycopg's is, values bound, never composed.
The psycopg path stays the reference: ``ArrowPeekError`` (redacted) tells the drain to take it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from airflow_pglogrepl.exceptions import ArrowPeekError, PublicationNotFoundError
from airflow_pglogrepl.identifiers import publication_list, validate_slot_name
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.adbc import AdbcError, adbc_session, text_array_literal

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BATCH_BYTES", "peek_arrow"]

BATCH_BYTES = 4 << 20  # ADBC's batch size hint; the decoder holds about 8x a batch at a time

# ADBC streams a result only for a statement without parameters, so the arguments are bound
# into session settings first, and this constant text reads them back: nothing is composed.
_PEEK = (
    "SELECT data FROM pg_logical_slot_peek_binary_changes("
    "current_setting('pglogrepl.peek_slot'), current_setting('pglogrepl.peek_upto')::pg_lsn, "
    "NULL, VARIADIC current_setting('pglogrepl.peek_options')::text[])"
)


def peek_arrow(
    params: dict[str, str],
    slot: str,
    *,
    label: str,
    upto_lsn: LSN | str,
    options: Mapping[str, str],
    batch_bytes: int = BATCH_BYTES,
) -> Iterator[pa.Array]:
    """Stream the ``data`` column of the slot's changes up to ``upto_lsn``, a batch at a time
    (whole transactions that commit before it, as ``peek_changes`` gives them). The slot does
    not move."""
    validate_slot_name(slot)
    arguments = {
        "slot": slot,
        "upto": str(LSN(upto_lsn)),
        "options": text_array_literal([item for pair in options.items() for item in pair]),
    }
    what = f"{label}: peeking slot {slot!r} through ADBC failed"
    try:
        with adbc_session(params, what=what) as session:
            # Looked for first on every version: 18 decodes past a missing publication with
            # only a warning, and older servers' error reaches us as ADBC's text only.
            missing = session.missing_publications(publication_list(options))
            if missing:
                raise PublicationNotFoundError(missing, slot)
            session.set({f"pglogrepl.peek_{name}": value for name, value in arguments.items()})
            for batch in session.batches(_PEEK, batch_bytes=batch_bytes):
                yield batch.column(0)
    except AdbcError as exc:
        raise ArrowPeekError(str(exc)) from None
