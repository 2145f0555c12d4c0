"""Statements that carry a secret: kept out of the server's logs and statistics, or not sent.

``CREATE SUBSCRIPTION ... CONNECTION '... password=...'`` (and ``ALTER SUBSCRIPTION ...
CONNECTION``) put the publisher's password into the statement's text, and a server has several
places that keep statement text: the log (``log_statement``, ``log_min_duration_statement``
under a slow statement, which creating a slot on the publisher can be, the sampled forms of
both, ``log_min_error_statement`` when the statement fails, ``debug_print_parse``),
``pg_stat_statements`` and pgaudit. Each of those settings is turned off for the one session
that sends the statement. Turning them off needs superuser, or ``GRANT SET ON PARAMETER``
(PostgreSQL 15+); a setting this role cannot change is fine only when its server value is
already harmless. Otherwise the statement is not sent (``PasswordExposureError``): there is no
way to take it back out of a log. ``track_activities`` (the statement shown in
``pg_stat_activity`` while it runs, to its role and ``pg_read_all_stats``) is turned off where
allowed, but not required: nothing keeps it after the statement.
See https://www.postgresql.org/docs/15/runtime-config-logging.html
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from psycopg import errors as pgerr

from airflow_pglogrepl.postgres.connect import Conn

__all__ = ["QUIET", "Quiet", "quiet_secret_statements"]


@dataclass(frozen=True)
class Quiet:
    """One setting that can keep statement text, the value that stops it, and when the server's
    own value is harmless already (given every setting's current value)."""

    name: str
    value: str
    harmless: Callable[[Mapping[str, str]], bool]
    required: bool = True


def _off(name: str, *quiet: str) -> Callable[[Mapping[str, str]], bool]:
    return lambda settings: settings.get(name, quiet[0]).lower() in quiet


QUIET: tuple[Quiet, ...] = (
    Quiet("log_statement", "none", _off("log_statement", "none")),
    Quiet("log_min_duration_statement", "-1", _off("log_min_duration_statement", "-1")),
    Quiet(
        "log_min_duration_sample",
        "-1",
        lambda s: (
            s.get("log_min_duration_sample", "-1") == "-1"
            or float(s.get("log_statement_sample_rate", "0")) == 0.0
        ),
    ),
    Quiet(
        "log_transaction_sample_rate",
        "0",
        lambda s: float(s.get("log_transaction_sample_rate", "0")) == 0.0,
    ),
    # a failing statement is logged at ERROR; only PANIC is above every error it can meet
    Quiet("log_min_error_statement", "panic", _off("log_min_error_statement", "panic")),
    Quiet("debug_print_parse", "off", _off("debug_print_parse", "off")),
    Quiet("debug_print_rewritten", "off", _off("debug_print_rewritten", "off")),
    Quiet(
        "pg_stat_statements.track",
        "none",
        lambda s: (
            s.get("pg_stat_statements.track", "none") == "none"
            or s.get("pg_stat_statements.track_utility", "on") == "off"
        ),
    ),
    Quiet("pgaudit.log", "none", _off("pgaudit.log", "none")),
    Quiet("track_activities", "off", _off("track_activities", "off"), required=False),
)


def quiet_secret_statements(conn: Conn) -> list[str]:
    """Turn off, for this session, every setting that would keep a statement's text; return
    what still would (``"<setting> = <value>"``), empty when the text is kept nowhere.

    Settings the server does not have (an extension not loaded) are skipped: nothing reads
    them. ``conn`` must be in autocommit mode (a refused ``SET`` must not abort a transaction).
    """
    names = [q.name for q in QUIET] + [
        "log_statement_sample_rate", "pg_stat_statements.track_utility",
    ]  # fmt: skip
    rows = conn.execute(
        "SELECT name, setting FROM pg_catalog.pg_settings WHERE name = ANY(%s)", (names,)
    ).fetchall()
    current = {row["name"]: str(row["setting"]) for row in rows}
    leaks: list[str] = []
    for quiet in QUIET:
        if quiet.name not in current:
            continue
        try:
            conn.execute("SELECT pg_catalog.set_config(%s, %s, false)", (quiet.name, quiet.value))
        except pgerr.InsufficientPrivilege:
            if quiet.required and not quiet.harmless(current):
                leaks.append(f"{quiet.name} = {current[quiet.name]}")
    return leaks
