"""libpq connection parameters from an Airflow connection, and keeping the password out of text.

Both the hook's own sessions and the ``CONNECTION`` clause of ``CREATE SUBSCRIPTION`` are built
from the same Airflow connection, so the mapping lives in one place. Anything that turns a
connection into text that could reach a log (an error message, a DSN shown to the user) goes
through :func:`redact`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Keywords libpq understands (PostgreSQL 15 client; newer clients add a few, which pass through
# the same way). Airflow-only extras of the postgres provider (``cursor``, ``iam``, ...) are not
# libpq keywords and are dropped here.
LIBPQ_KEYWORDS = frozenset(
    {
        "service", "user", "password", "passfile", "channel_binding", "connect_timeout",
        "dbname", "host", "hostaddr", "port", "client_encoding", "options", "application_name",
        "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
        "keepalives_count", "tcp_user_timeout", "sslmode", "sslnegotiation", "sslcompression",
        "sslcert", "sslkey", "sslcertmode", "sslpassword", "sslrootcert", "sslcrl", "sslcrldir",
        "sslsni", "requirepeer", "require_auth", "min_protocol_version", "max_protocol_version",
        "ssl_min_protocol_version", "ssl_max_protocol_version", "gssencmode", "krbsrvname",
        "gsslib", "gssdelegation", "replication", "target_session_attrs", "load_balance_hosts",
    }
)  # fmt: skip

SECRET_KEYWORDS = frozenset({"password", "sslpassword"})

# The one way a Spark application is told its source: the environment, never argv (which ps and
# the Spark UI show). The operators set it, the applications read it, errors name it.
SOURCE_DSN_ENV = "PGLOGREPL_SOURCE_DSN"
# Set by the operators beside it: an error the application reports in its summary line is raised
# by the operator, so the application does not also log it (each failure once in the task log).
SUBMITTED_ENV = "PGLOGREPL_SUBMITTED_BY_OPERATOR"
DEFAULT_APPLICATION_NAME = "airflow-pglogrepl"
_MASK = "***"


def libpq_params(
    *,
    host: str | None,
    port: int | None,
    user: str | None,
    password: str | None,
    dbname: str | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Keyword parameters for ``psycopg.connect`` from an Airflow connection's fields.

    Extras that are libpq keywords (``sslmode``, ``sslrootcert``, ``connect_timeout``,
    ``options`` ...) pass through; Airflow-only extras are dropped. ``application_name`` defaults
    to ``airflow-pglogrepl`` so a DBA can tell our sessions apart in ``pg_stat_activity``.
    """
    params: dict[str, str] = {}
    for key, value in (extra or {}).items():
        if key in LIBPQ_KEYWORDS and value is not None and value != "":
            params[key] = _text(value)
    fields = {"host": host, "port": port, "user": user, "password": password, "dbname": dbname}
    for key, value in fields.items():
        if value is not None and value != "":
            params[key] = str(value)
    params.setdefault("application_name", DEFAULT_APPLICATION_NAME)
    return params


def _text(value: Any) -> str:
    if isinstance(value, bool):  # libpq wants 1/0, JSON extras often carry true/false
        return "1" if value else "0"
    return str(value)


def make_dsn(params: Mapping[str, str]) -> str:
    """A libpq keyword/value string; values are quoted as libpq requires.

    See https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-CONNSTRING
    """
    return " ".join(f"{key}={_quote(value)}" for key, value in params.items())


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def describe(params: Mapping[str, str]) -> str:
    """``user@host:port/dbname`` for messages: enough to find the server, nothing secret."""
    user = params.get("user", "?")
    host = params.get("host", "localhost")
    port = params.get("port", "5432")
    db = params.get("dbname", user)
    return f"{user}@{host}:{port}/{db}"


def secrets_of(params: Mapping[str, str]) -> list[str]:
    """The secret values in ``params``, for :func:`redact`."""
    return [params[key] for key in SECRET_KEYWORDS if params.get(key)]


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``***``: raw, libpq-quoted, and libpq-quoted inside
    an SQL string literal, ``'...'`` or ``E'...'`` (a ``CONNECTION`` clause the server echoes)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        quoted = _quote(secret)
        body = quoted[1:-1]
        in_literal = body.replace("'", "''")
        in_e_literal = body.replace("\\", "\\\\").replace("'", "''")
        for form in (quoted, in_e_literal, in_literal, secret):
            text = text.replace(form, _MASK)
    return text
