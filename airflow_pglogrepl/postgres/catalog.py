"""The catalog statements of the preflight checks, as functions of a psycopg connection: the
connecting role, the requested tables (columns, unique indexes, leaf partitions, privileges), the
capacity taken on each side, and the one statement that changes anything, ``ALTER TABLE ...
REPLICA IDENTITY``.

Every function reads a batch in one statement (all tables at once, never one query per table)
and returns the plain records of ``airflow_pglogrepl.models.facts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from airflow_pglogrepl.models.facts import (
    IndexFacts,
    PublisherUsage,
    RoleFacts,
    SubscriberUsage,
    TableFacts,
)
from airflow_pglogrepl.postgres.columns import columns_from_json, columns_json
from airflow_pglogrepl.postgres.connect import Conn
from airflow_pglogrepl.tables import TableRef

# One row per requested table that exists (matched by exact schema and name), with its columns,
# its unique indexes (key columns only: INCLUDE columns play no part in an identity) and, for a
# partitioned table, its leaf partitions. Privileges are the connecting role's.
# See https://www.postgresql.org/docs/15/catalog-pg-index.html
_TABLES_QUERY = sql.SQL("""
SELECT n.nspname AS schema_name, c.relname AS table_name, c.relkind::text AS relkind,
    c.relpersistence::text AS persistence, c.relreplident::text AS replica_identity,
    has_table_privilege(c.oid, 'SELECT') AS can_select,
    has_schema_privilege(n.oid, 'USAGE') AS can_use_schema,
    {columns} AS columns,
    (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'name', ic.relname,
            'primary', i.indisprimary,
            'unique', i.indisunique,
            'replica_identity', i.indisreplident,
            'valid', i.indisvalid,
            'immediate', i.indimmediate,
            'partial', i.indpred IS NOT NULL,
            'expression', i.indexprs IS NOT NULL,
            'columns', k.columns,
            'nullable_columns', k.nullable) ORDER BY ic.relname), '[]'::jsonb)
        FROM pg_index i
        JOIN pg_class ic ON ic.oid = i.indexrelid
        CROSS JOIN LATERAL (
            SELECT coalesce(jsonb_agg(a.attname ORDER BY key.ord), '[]'::jsonb) AS columns,
                coalesce(jsonb_agg(a.attname ORDER BY key.ord) FILTER (WHERE NOT a.attnotnull),
                    '[]'::jsonb) AS nullable
            FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS key(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = key.attnum
            WHERE key.ord <= i.indnkeyatts) AS k
        WHERE i.indrelid = c.oid AND i.indisunique) AS indexes,
    CASE WHEN c.relkind = 'p' THEN (
        SELECT coalesce(jsonb_agg(jsonb_build_array(ln.nspname, lc.relname)
                ORDER BY ln.nspname, lc.relname), '[]'::jsonb)
            FROM pg_partition_tree(c.oid) AS tree
            JOIN pg_class lc ON lc.oid = tree.relid
            JOIN pg_namespace ln ON ln.oid = lc.relnamespace
            WHERE tree.isleaf AND lc.relkind = 'r')
    END AS leaf_partitions
FROM unnest(%s::text[], %s::text[]) AS wanted(schema_name, table_name)
JOIN pg_namespace n ON n.nspname = wanted.schema_name
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = wanted.table_name
""").format(columns=columns_json(base_type=False))

# Statements ALTER TABLE ... REPLICA IDENTITY may end with, keyed by mode; "index" adds a name.
_IDENTITY_TARGETS = {
    "default": sql.SQL("DEFAULT"),
    "full": sql.SQL("FULL"),
    "nothing": sql.SQL("NOTHING"),
}


def role_facts(conn: Conn) -> RoleFacts:
    """The connecting role (``current_user``): superuser, REPLICATION, LOGIN, BYPASSRLS."""
    row = conn.execute(
        "SELECT rolname AS name, rolsuper AS superuser, rolreplication AS replication,"
        " rolcanlogin AS can_login, rolbypassrls AS bypass_rls"
        " FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None
    return RoleFacts(**row)


def table_facts(conn: Conn, tables: Sequence[TableRef]) -> dict[TableRef, TableFacts]:
    """Facts about each of ``tables`` that exists, matched by exact schema and name."""
    if not tables:
        return {}
    rows = conn.execute(
        _TABLES_QUERY, ([t.schema for t in tables], [t.name for t in tables])
    ).fetchall()
    facts = [_table_facts(row) for row in rows]
    return {f.table: f for f in facts}


def publisher_usage(conn: Conn) -> PublisherUsage:
    """Slots that exist (any type) and WAL senders running: capacity already taken."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pg_replication_slots)::int AS slots_in_use,"
        " (SELECT count(*) FROM pg_stat_replication)::int AS wal_senders_in_use"
    ).fetchone()
    assert row is not None
    return PublisherUsage(**row)


def subscriber_usage(conn: Conn) -> SubscriberUsage:
    """Subscriptions (cluster-wide) and the sync/parallel workers running now.

    ``leader_pid`` (parallel apply, PostgreSQL 16+) is read through ``to_jsonb`` so the same
    statement runs on 15, which lacks the column.
    """
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pg_subscription)::int AS subscriptions,"
        " (SELECT count(*) FROM pg_subscription WHERE subenabled)::int"
        "  AS enabled_subscriptions,"
        " (SELECT count(*) FROM pg_stat_subscription s WHERE s.pid IS NOT NULL"
        "   AND (s.relid IS NOT NULL OR to_jsonb(s) ->> 'leader_pid' IS NOT NULL))::int"
        "  AS extra_workers_running"
    ).fetchone()
    assert row is not None
    return SubscriberUsage(**row)


def replica_identity_statement(table: TableRef, mode: str, index: str | None) -> sql.Composed:
    """``ALTER TABLE table REPLICA IDENTITY {DEFAULT | FULL | NOTHING | USING INDEX index}``;
    ``ValueError`` names the table when the mode or index does not make one."""
    if mode == "index":
        if not index:
            raise ValueError(f"REPLICA IDENTITY USING INDEX on {table} needs an index name")
        target: sql.Composable = sql.SQL("USING INDEX {}").format(sql.Identifier(index))
    elif mode in _IDENTITY_TARGETS and index is None:
        target = _IDENTITY_TARGETS[mode]
    else:
        raise ValueError(
            f"replica identity mode {mode!r} (index {index!r}) for {table}: use 'default', "
            f"'full', 'nothing', or 'index' with an index name"
        )
    return sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(
        sql.Identifier(table.schema, table.name), target
    )


def set_replica_identity(conn: Conn, statement: sql.Composed, lock_timeout: str) -> None:
    """Run ``statement`` (``replica_identity_statement``) in a transaction of its own that waits
    at most ``lock_timeout`` for the table's ACCESS EXCLUSIVE lock; psycopg's errors pass."""
    with conn.transaction():
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (lock_timeout,))
        conn.execute(statement)


def _table_facts(row: dict[str, Any]) -> TableFacts:
    return TableFacts(
        table=TableRef(row["schema_name"], row["table_name"]),
        relkind=row["relkind"],
        persistence=row["persistence"],
        replica_identity=row["replica_identity"],
        can_select=row["can_select"],
        can_use_schema=row["can_use_schema"],
        columns=columns_from_json(row["columns"]),
        indexes=tuple(
            IndexFacts(
                name=ix["name"],
                columns=tuple(ix["columns"]),
                nullable_columns=tuple(ix["nullable_columns"]),
                primary=ix["primary"],
                unique=ix["unique"],
                replica_identity=ix["replica_identity"],
                valid=ix["valid"],
                immediate=ix["immediate"],
                partial=ix["partial"],
                expression=ix["expression"],
            )
            for ix in row["indexes"]
        ),
        leaf_partitions=tuple(TableRef(s, n) for s, n in row["leaf_partitions"] or ()),
    )
