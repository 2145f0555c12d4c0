"""Opening psycopg sessions from libpq parameters: LSN adapters, redacted connection errors."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import ConnectionFailedError
from airflow_pglogrepl.postgres.lsn_adapters import register_lsn_adapters
from airflow_pglogrepl.versions import Features

Conn: TypeAlias = psycopg.Connection[dict[str, Any]]
AsyncConn: TypeAlias = psycopg.AsyncConnection[dict[str, Any]]

# The server's WARNINGs and NOTICEs on our statements ("wal_level is insufficient to publish
# logical changes" after CREATE PUBLICATION): logged here, under this logger.
server_log = logging.getLogger("airflow_pglogrepl.server")

# Sent only when client_min_messages was lowered (a role's or database's setting, or the
# connection's options): they echo statement text ("parse <unnamed>: CREATE SUBSCRIPTION ...
# CONNECTION '... password=...'"), which no redaction can be trusted to catch in every quoting.
# The server's own log has them; the task log does not.
_UNLOGGED = ("DEBUG", "LOG")


def notice_logger(
    server: str, secrets: Sequence[str] = ()
) -> Callable[[psycopg.errors.Diagnostic], None]:
    """A notice handler (``conn.add_notice_handler``) logging what ``server`` said, with
    ``secrets`` masked: WARNING as a warning; NOTICE and INFO as info, since the server says
    routine things at NOTICE ("created replication slot ... on publisher" on every subscription
    created); DEBUG and LOG not at all (they echo statements)."""

    def log_notice(diag: psycopg.errors.Diagnostic) -> None:
        severity = diag.severity_nonlocalized or diag.severity or "NOTICE"
        if severity in _UNLOGGED:
            return
        text = diag.message_primary or ""
        for label, extra in (("DETAIL", diag.message_detail), ("HINT", diag.message_hint)):
            if extra:
                text += f" {label}: {extra}"
        text = conninfo.redact(text, secrets)
        level = logging.WARNING if severity == "WARNING" else logging.INFO
        server_log.log(level, "PostgreSQL %s says: %s: %s", server, severity, text)

    return log_notice


# Seconds a connection may take to be made when the user set no connect_timeout. libpq waits
# for ever without one (ADBC's sessions: a frozen server hung a run in its connect), psycopg
# 130 s per host; a reachable server answers in well under a second.
CONNECT_TIMEOUT_S = 10


def bounded_connect(params: Mapping[str, str]) -> dict[str, str]:
    """``params`` with ``connect_timeout`` at ``CONNECT_TIMEOUT_S`` when the user set none:
    not in them, nor in ``PGCONNECT_TIMEOUT``, nor maybe in a service's file (``service``,
    ``PGSERVICE``: libpq reads it, we do not, so a service is left as it is)."""
    bounded = dict(params)
    if not any(key in params for key in ("connect_timeout", "service")) and not any(
        os.environ.get(name) for name in ("PGCONNECT_TIMEOUT", "PGSERVICE")
    ):
        bounded["connect_timeout"] = str(CONNECT_TIMEOUT_S)
    return bounded


def dsn_params(dsn: str) -> dict[str, str]:
    """libpq keyword parameters of a conninfo string or URI (``application_name`` defaulted)."""
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    params.setdefault("application_name", "airflow-pglogrepl")
    return params


# Every setting that changes a type's text output, fixed to the forms the decoder's converters
# parse (``pgoutput.values``), whatever the server's, database's or role's defaults. pgoutput
# prints values with the output functions of the session that decodes: for a peek, ours. The
# snapshot's COPY and the drain's peek must print a value the same way, so both use this.
# lc_monetary is left alone: money has no scale of its own, it prints as its locale says.
TEXT_OUTPUT: dict[str, str] = {
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "bytea_output": "hex",
    "extra_float_digits": "1",
}


def long_work_settings(server_version: int, *, lock_timeout_ms: int = 0) -> dict[str, str]:
    """Session settings for work that may take hours (a snapshot's copy, the session holding
    its locks, a peek of a big window): every server timeout that would end it is turned off,
    whatever the server, database or role configured. ``lock_timeout_ms`` bounds lock waits
    (0: wait). ``idle_session_timeout`` exists from PostgreSQL 14, ``transaction_timeout``
    from 17; ``server_version`` is
    ``server_version_num`` (``conn.info.server_version``)."""
    settings = {
        "statement_timeout": "0",
        "idle_in_transaction_session_timeout": "0",
        "lock_timeout": str(int(lock_timeout_ms)),
    }
    features = Features.of(server_version)
    if features.idle_session_timeout:
        settings["idle_session_timeout"] = "0"
    if features.transaction_timeout:
        settings["transaction_timeout"] = "0"
    return settings


def set_session(conn: Conn, settings: dict[str, str]) -> None:
    """Apply session settings (``set_config``: names and values bound, nothing composed)."""
    for name, value in settings.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))


def connect(
    params: dict[str, str],
    *,
    label: str,
    replication: bool = False,
    autocommit: bool = True,
    application_name: str | None = None,
    secrets: Sequence[str] = (),
) -> Conn:
    """An open connection with ``pg_lsn`` read and written as ``LSN`` (close it, or use ``with``).

    ``replication=True`` opens a ``replication=database`` connection, which accepts the
    replication protocol's commands (``CREATE_REPLICATION_SLOT ... SNAPSHOT 'export'``).
    Failures raise ``ConnectionFailedError`` naming ``label`` (where the parameters came from),
    with the password removed. The server's notices are logged (``notice_logger``) with this
    connection's secrets and ``secrets`` (others its statements carry) masked. A connection is
    made within ``connect_timeout``, ``CONNECT_TIMEOUT_S`` when the user set none
    (``bounded_connect``).
    """
    params = bounded_connect(params)
    if replication:
        params["replication"] = "database"
    if application_name:
        params["application_name"] = application_name
    try:
        conn = psycopg.connect(
            conninfo.make_dsn(params),
            autocommit=autocommit,
            row_factory=dict_row,
            cursor_factory=psycopg.ClientCursor if replication else psycopg.Cursor,
        )
    except psycopg.OperationalError as exc:
        raise connect_error(params, exc, label) from None
    masked = [*conninfo.secrets_of(params), *secrets]
    conn.add_notice_handler(notice_logger(conninfo.describe(params), masked))
    register_lsn_adapters(conn)
    return conn


def connect_error(
    params: dict[str, str], exc: psycopg.OperationalError, label: str
) -> ConnectionFailedError:
    reason = conninfo.redact(str(exc).strip(), conninfo.secrets_of(params))
    return ConnectionFailedError(
        f"cannot connect to PostgreSQL {conninfo.describe(params)} ({label}): {reason}. Fix: "
        f"check host, port, login and password there and that the server accepts it "
        f"(pg_hba.conf)"
    )


def server_of(conn: Conn) -> str:
    """``host:port`` of the server ``conn`` is connected to, for messages and fixes."""
    return f"{conn.info.host}:{conn.info.port}"


def in_hot_standby(conn: Conn) -> bool:
    """Whether ``conn``'s server is a standby, as it reported at login (``in_hot_standby``,
    14+): no query, so it holds on a replication connection too."""
    return conn.info.parameter_status("in_hot_standby") == "on"


def show(conn: Conn, name: str) -> str:
    """A server setting's current value (``current_setting``) as text."""
    row = conn.execute("SELECT current_setting(%s) AS value", (name,)).fetchone()
    return str(row["value"]) if row else "unknown"


def run_ddl(conn: Conn, statement: sql.Composed | sql.SQL) -> None:
    """Execute one DDL statement through the extended query protocol.

    DDL cannot take bound parameters, so values in it are ``sql.Literal``s; some definitions also
    carry SQL the DAG author wrote (publication row filters). ``binary=True`` makes psycopg use
    the extended protocol, which accepts exactly one statement: nothing can be stacked after it.
    """
    conn.execute(statement, binary=True)
