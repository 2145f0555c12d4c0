"""ADBC sessions (``adbc-driver-postgresql``): where the product reads many rows as Arrow.

ADBC runs a query as ``COPY ... (FORMAT binary)`` and parses the rows in C into Arrow record
batches, with no Python object per value. Both bulk reads use it: the drain's peek of a window
(``arrow_peek``) and the snapshot's copy of a block range (``snapshot.SnapshotReader``).

A session is set up as psycopg's are: the settings that fix every type's text output
(``connect.TEXT_OUTPUT``, and the caller's), autocommit, and nothing composed from a value.
ADBC streams a result in batches only for a statement without bound parameters (with them,
libpq returns the whole result at once), so the bulk statements are constant text or
identifiers and literals already quoted. Connection parameters reach libpq as a conninfo string
inside this process; the password is redacted from any error's text before it is raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.postgres.connect import TEXT_OUTPUT, bounded_connect, long_work_settings

__all__ = ["AdbcError", "AdbcSession", "adbc_session"]

if TYPE_CHECKING:
    import pyarrow as pa


class AdbcError(Exception):
    """An ADBC connection or statement failed; the text is redacted of the password."""


class AdbcSession:
    """One ADBC connection; each call raises ``AdbcError`` (redacted) on failure, and only the
    caller's own errors pass through as they are."""

    def __init__(self, conn: Any, cursor: Any, what: str, secrets: list[str]) -> None:
        self._conn = conn
        self._cursor = cursor
        self._what = what
        self._secrets = secrets

    def run(self, statement: str) -> None:
        """Execute a statement that returns no rows (``BEGIN``, ``SET TRANSACTION ...``), on a
        statement of its own (the session's cursor caches the text it last ran)."""
        with self._guard():
            cursor = self._conn.cursor()
            try:
                cursor.adbc_statement.set_sql_query(statement)
                cursor.adbc_statement.execute_update()
            finally:
                cursor.close()

    def set(self, settings: Mapping[str, str]) -> None:
        """Session settings through ``set_config`` (names and values bound)."""
        with self._guard():
            for name, value in settings.items():
                self._cursor.execute("SELECT set_config($1, $2, false)", (name, value))
                self._cursor.fetchall()

    def server_version(self) -> int:
        """The server's ``server_version_num`` (settings depend on it)."""
        with self._guard():
            self._cursor.execute("SELECT current_setting('server_version_num')::int")
            row = self._cursor.fetchone()
        return int(row[0])

    def missing_publications(self, names: list[str]) -> list[str]:
        """The ``names`` no publication of the connected database has (``server``'s query)."""
        from airflow_pglogrepl.postgres.server import MISSING_PUBLICATIONS

        with self._guard():
            query = MISSING_PUBLICATIONS.replace("%s", "$1")
            self._cursor.execute(query, (text_array_literal(names),))
            return [str(row[0]) for row in self._cursor.fetchall()]

    def batches(self, query: str, *, batch_bytes: int) -> Iterator[pa.RecordBatch]:
        """The rows of ``query`` (no parameters: it streams) as record batches of about
        ``batch_bytes``, read one at a time."""
        with self._guard():
            self._cursor.adbc_statement.set_options(
                **{"adbc.postgresql.batch_size_hint_bytes": str(batch_bytes)}
            )
            self._cursor.execute(query)
            reader = iter(self._cursor.fetch_record_batch())
        while True:
            with self._guard():
                batch = next(reader, None)
            if batch is None:
                return
            yield batch

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Around ADBC's own calls only: whatever they raise is the session's failure."""
        try:
            yield
        except Exception as exc:
            raise AdbcError(_message(self._what, exc, self._secrets)) from None


@contextmanager
def adbc_session(
    params: Mapping[str, str], *, what: str, lock_timeout_ms: int = 0
) -> Iterator[AdbcSession]:
    """An open ADBC session in autocommit mode with ``connect.TEXT_OUTPUT`` and
    ``connect.long_work_settings`` applied (every bulk read may take long); closed on the way
    out. ``what`` says in an error what was being done. The connection is made within
    ``connect_timeout`` (``connect.bounded_connect``: libpq would wait for ever), or raises
    ``AdbcError``."""
    secrets = conninfo.secrets_of(dict(params))
    try:
        from adbc_driver_postgresql import dbapi
    except ImportError as exc:
        raise AdbcError(f"{what}: adbc-driver-postgresql is not installed: {exc}") from None
    try:
        conn = dbapi.connect(conninfo.make_dsn(bounded_connect(params)), autocommit=True)
    except Exception as exc:
        raise AdbcError(_message(what, exc, secrets)) from None
    try:
        cursor = conn.cursor()
        try:
            session = AdbcSession(conn, cursor, what, secrets)
            session.set(TEXT_OUTPUT)
            version = session.server_version()
            session.set(long_work_settings(version, lock_timeout_ms=lock_timeout_ms))
            yield session
        finally:
            with contextlib.suppress(Exception):  # what was read is complete; nothing to keep
                cursor.close()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _message(what: str, exc: Exception, secrets: list[str]) -> str:
    """One line: what was being done, the driver's text (the server's message in it), redacted."""
    text = conninfo.redact(f"{type(exc).__name__}: {exc}", secrets)  # before spaces change
    return f"{what}: " + " ".join(text.split())


def text_array_literal(items: list[str]) -> str:
    """A ``text[]`` literal (array input syntax, not SQL) to bind as one text parameter: every
    element quoted, ``"`` and ``\\`` escaped."""
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"
