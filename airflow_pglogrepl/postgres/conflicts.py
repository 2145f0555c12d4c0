"""The statements on a subscription's apply errors, as functions of a psycopg connection to the
subscriber: what it tells over SQL of its workers, counters and progress, and the two ways past
a transaction that cannot apply (``SKIP``; on servers without it, the replication origin).
See https://www.postgresql.org/docs/15/logical-replication-conflicts.html
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from psycopg import errors as pgerr
from psycopg import sql

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.connect import Conn, run_ddl
from airflow_pglogrepl.versions import Features


def error_head(conn: Conn, name: str) -> dict[str, Any] | None:
    """The subscription's oid, slot, publications, pending skip, counters' reset time, apply
    worker and table-sync workers; None when there is no such subscription."""
    newer = Features.of(conn.info.server_version).subscription_skip
    row = conn.execute(
        sql.SQL(
            "SELECT s.oid, s.subslotname, s.subpublications, {skip} AS skip_lsn,"
            " {reset} AS stats_reset,"
            " (SELECT min(w.pid) FROM pg_stat_subscription w WHERE w.subid = s.oid"
            "  AND w.relid IS NULL AND w.pid IS NOT NULL) AS apply_pid,"
            " (SELECT coalesce(jsonb_agg(jsonb_build_array(n.nspname, c.relname)), '[]')"
            "  FROM pg_stat_subscription w JOIN pg_class c ON c.oid = w.relid"
            "  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE w.subid = s.oid"
            "  AND w.pid IS NOT NULL) AS sync_rels"
            " FROM pg_subscription s WHERE s.subname = %s AND s.subdbid ="
            " (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).format(
            skip=sql.SQL("nullif(s.subskiplsn, '0/0')" if newer else "NULL::pg_lsn"),
            reset=sql.SQL(
                "(SELECT st.stats_reset FROM pg_stat_subscription_stats st WHERE st.subid = s.oid)"
                if newer
                else "NULL::timestamptz"
            ),
        ),
        (name,),
    ).fetchone()
    return None if row is None else dict(row)


def conflict_counts(conn: Conn, subid: int) -> dict[str, int] | None:
    """``pg_stat_subscription_stats``' conflict counters by kind (``insert_exists`` ...), 18+;
    None on servers that do not count them."""
    if not Features.of(conn.info.server_version).conflict_counters:
        return None
    row = conn.execute(
        "SELECT to_jsonb(st) AS st FROM pg_stat_subscription_stats st WHERE st.subid = %s",
        (subid,),
    ).fetchone()
    return {
        key.removeprefix("confl_"): int(value)
        for key, value in (row["st"] if row else {}).items()
        if key.startswith("confl_")
    }


def origin_progress(conn: Conn, subid: int) -> LSN | None:
    """The end of the last remote transaction the subscription applied (its replication
    origin's ``remote_lsn``); None before the first, or for a role that may not read it
    (superusers and grantees only)."""
    with suppress(pgerr.InsufficientPrivilege):
        row = conn.execute(
            "SELECT remote_lsn FROM pg_replication_origin_status WHERE external_id = %s",
            (f"pg_{subid}",),
        ).fetchone()
        return row["remote_lsn"] if row and int(row["remote_lsn"]) else None
    return None


def skip(conn: Conn, name: str, lsn: LSN | None) -> None:
    """``ALTER SUBSCRIPTION ... SKIP (lsn = ...)`` (15+): the apply worker skips the remote
    transaction finishing exactly at ``lsn``; None withdraws a pending skip."""
    value = sql.SQL("NONE") if lsn is None else sql.Literal(str(lsn))
    run_ddl(
        conn,
        sql.SQL("ALTER SUBSCRIPTION {} SKIP (lsn = {})").format(sql.Identifier(name), value),
    )


def set_enabled(conn: Conn, name: str, enabled: bool) -> None:
    """``ALTER SUBSCRIPTION ... ENABLE`` or ``DISABLE``."""
    verb = sql.SQL("ENABLE" if enabled else "DISABLE")
    run_ddl(conn, sql.SQL("ALTER SUBSCRIPTION {} {}").format(sql.Identifier(name), verb))


def advance_origin(conn: Conn, name: str, lsn: LSN) -> None:
    """``pg_replication_origin_advance``: the subscription's origin moves to ``lsn``, and
    everything up to it counts as applied (run with the subscription disabled)."""
    conn.execute(
        "SELECT pg_replication_origin_advance('pg_' || s.oid, %s)"
        " FROM pg_subscription s WHERE s.subname = %s AND s.subdbid ="
        " (SELECT oid FROM pg_database WHERE datname = current_database())",
        (lsn, name),
    )


def reset_error_stats(conn: Conn, name: str) -> None:
    """``pg_stat_reset_subscription_stats``: the apply and sync error counters back to zero."""
    conn.execute(
        "SELECT pg_stat_reset_subscription_stats(s.oid) FROM pg_subscription s"
        " WHERE s.subname = %s AND s.subdbid ="
        " (SELECT oid FROM pg_database WHERE datname = current_database())",
        (name,),
    )
