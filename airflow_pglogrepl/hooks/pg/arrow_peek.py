"""A slot's changes as Arrow batches, fetched in C by ADBC (``adbc-driver-postgresql``).

``peek_changes`` (psycopg) hands over one Python ``bytes`` object per message. ADBC runs the
same ``pg_logical_slot_peek_binary_changes`` as ``COPY ... (FORMAT binary)`` and parses the
result in C into Arrow record batches: the messages arrive as one ``binary`` column, a single
buffer plus offsets, which the columnar decoder reads without a Python object per message.

The session is set up as psycopg's is: the text output settings (``connect.TEXT_OUTPUT``),
autocommit, values bound (``$1``...), never composed. Connection parameters go to libpq as a
conninfo string inside this process; an error's text is redacted of the password before it is
raised. The psycopg path stays the reference: ``ArrowPeekError`` tells the drain to take it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import ArrowPeekError
from airflow_pglogrepl.hooks.pg.connect import TEXT_OUTPUT
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.names import validate_slot_name

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BATCH_BYTES", "peek_arrow"]

BATCH_BYTES = 4 << 20  # ADBC's batch size hint; the decoder holds about 8x a batch at a time

# ADBC streams a result in batches only for a statement without parameters (with them, libpq
# returns the whole result at once). So the arguments are bound into session settings first,
# and this constant text reads them back: nothing is composed into SQL.
_ARGUMENTS = "SELECT set_config('pglogrepl.peek_' || $1, $2, false)"
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
    secrets = conninfo.secrets_of(params)
    try:
        from adbc_driver_postgresql import dbapi
    except ImportError as exc:
        raise ArrowPeekError(f"adbc-driver-postgresql is not installed: {exc}") from None
    arguments = {
        "slot": slot,
        "upto": str(LSN(upto_lsn)),
        "options": _text_array([item for pair in options.items() for item in pair]),
    }
    try:
        conn = dbapi.connect(conninfo.make_dsn(params), autocommit=True)
    except Exception as exc:
        raise ArrowPeekError(_redacted(label, slot, exc, secrets)) from None
    try:
        cursor = conn.cursor()
        try:
            for name, value in TEXT_OUTPUT.items():
                cursor.execute("SELECT set_config($1, $2, false)", (name, value))
                cursor.fetchall()
            for name, value in arguments.items():
                cursor.execute(_ARGUMENTS, (name, value))
                cursor.fetchall()
            cursor.adbc_statement.set_options(
                **{"adbc.postgresql.batch_size_hint_bytes": str(batch_bytes)}
            )
            cursor.execute(_PEEK)
            reader = cursor.fetch_record_batch()
            for batch in reader:
                yield batch.column(0)
        except ArrowPeekError:
            raise
        except Exception as exc:
            raise ArrowPeekError(_redacted(label, slot, exc, secrets)) from None
        finally:
            cursor.close()
    finally:
        conn.close()


def _text_array(items: list[str]) -> str:
    """A ``text[]`` literal (array input syntax, not SQL): every element quoted, ``"`` and
    ``\\`` escaped."""
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


def _redacted(label: str, slot: str, exc: Exception, secrets: list[str]) -> str:
    text = conninfo.redact(f"{type(exc).__name__}: {exc}", secrets)
    return f"{label}: peeking slot {slot!r} through ADBC failed: {text}"
