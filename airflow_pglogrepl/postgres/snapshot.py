"""Initial snapshots: a slot created with an exported snapshot, and reading tables inside it.

``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')`` returns the slot's consistent point and the
name of a snapshot that sees exactly the transactions committed before it: a copy taken in that
snapshot plus the slot's changes from there on is the table, with no gap and no overlap. The
snapshot lives only while the creating session stays open and idle, so ``ExportedSnapshot`` holds
that session until the caller closes it, after every reader has imported the snapshot.
See https://www.postgresql.org/docs/15/protocol-replication.html#PROTOCOL-REPLICATION-CREATE-REPLICATION-SLOT

``SnapshotReader`` is what each Spark task uses (no Airflow, which executors need not have): one
session per task, ``SET TRANSACTION SNAPSHOT`` and one read of a ctid range. The read goes through
ADBC (``adbc.adbc_session``), which fetches the rows in C straight into Arrow record batches;
psycopg keeps the catalog query, which returns a row per table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV
from airflow_pglogrepl.exceptions import SnapshotReadError, SnapshotWaitError
from airflow_pglogrepl.identifiers import validate_slot_name
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.failover import wants_failover
from airflow_pglogrepl.postgres.adbc import AdbcError, adbc_session
from airflow_pglogrepl.postgres.columns import columns_from_json, columns_json
from airflow_pglogrepl.postgres.connect import (
    TEXT_OUTPUT,
    connect,
    in_hot_standby,
    long_work_settings,
    server_of,
    set_session,
    show,
)
from airflow_pglogrepl.postgres.errors import slot_errors
from airflow_pglogrepl.postgres.passfile import PASSFILE_HINT
from airflow_pglogrepl.tables import Column, TableRef

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "READER_SETTINGS",
    "ExportedSnapshot",
    "SnapshotReader",
    "SnapshotTable",
    "create_slot_with_snapshot",
    "select_statement",
    "select_statements",
    "validate_snapshot_name",
]

log = logging.getLogger("airflow_pglogrepl.snapshot")

# Session settings of every reader: values come out in exactly the text forms the decoder's
# converters parse (``pgoutput.values``), whatever the server's or role's defaults. Timeouts are
# ``connect.long_work_settings``: a big range's read must not be cut short by a configured one.
READER_SETTINGS: dict[str, str] = {**TEXT_OUTPUT, "client_encoding": "UTF8"}

_SNAPSHOT_NAME = re.compile(r"[0-9A-F]{8,16}-[0-9A-F]{8,16}-[0-9]{1,10}", re.IGNORECASE)

# One row per published table, read inside the snapshot so that membership, columns and identity
# are those at the consistent point. Columns are what pgoutput sends: not dropped, not generated;
# a domain's base type is resolved the way pgoutput's Type message names it (``getBaseType``).
# The identity index is the one relcache would pick (``RelationGetIndexList``): valid, unique,
# immediate, no predicate; the primary key for DEFAULT, the marked index for USING INDEX.
_TABLES_QUERY = sql.SQL("""
SELECT n.nspname AS schema_name, c.relname AS table_name, c.oid::bigint AS relid,
    c.relkind::text AS relkind, c.relreplident::text AS replica_identity,
    coalesce(leaves.tuples, c.reltuples)::float8 AS reltuples,
    coalesce(leaves.pages, c.relpages)::bigint AS relpages,
    (coalesce(leaves.size, pg_relation_size(c.oid))
        / current_setting('block_size')::bigint) AS blocks,
    (coalesce(leaves.widest, pg_relation_size(c.oid))
        / current_setting('block_size')::bigint) AS span,
    p.publications,
    {columns} AS columns,
    (SELECT coalesce(jsonb_agg(k.attnum ORDER BY k.attnum), '[]'::jsonb)
        FROM pg_index i
        CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
        WHERE i.indrelid = c.oid AND k.ord <= i.indnkeyatts
            AND i.indisvalid AND i.indisunique AND i.indimmediate AND i.indpred IS NULL
            AND ((c.relreplident = 'd' AND i.indisprimary)
                OR (c.relreplident = 'i' AND i.indisreplident))) AS key_attnums
FROM (
    SELECT schemaname, tablename, jsonb_agg(jsonb_build_object(
            'publication', pubname,
            'columns', attnames,
            'row_filter', rowfilter) ORDER BY pubname) AS publications
    FROM pg_publication_tables
    WHERE pubname = ANY(%(publications)s)
        -- only the tables asked for, when some are: a leaf's size locks it, until the end of
        -- a backfill chunk's transaction
        AND (%(schemas)s::text[] IS NULL OR (schemaname::text, tablename::text) IN (
            SELECT * FROM unnest(%(schemas)s::text[], %(names)s::text[])))
    GROUP BY schemaname, tablename) AS p
JOIN pg_namespace n ON n.nspname = p.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
-- a partitioned table's heap is its leaves': their sizes, and the planner's estimates of the
-- leaves it has measured (-1 rows: none)
LEFT JOIN LATERAL (
    SELECT sum(pg_relation_size(l.oid)) AS size, max(pg_relation_size(l.oid)) AS widest,
        coalesce(sum(l.reltuples) FILTER (WHERE l.reltuples >= 0), -1) AS tuples,
        coalesce(sum(l.relpages) FILTER (WHERE l.reltuples >= 0), 0) AS pages
    FROM pg_partition_tree(c.oid) AS t JOIN pg_class l ON l.oid = t.relid
    WHERE c.relkind = 'p' AND t.isleaf AND l.relkind <> 'f') AS leaves ON c.relkind = 'p'
ORDER BY n.nspname, c.relname
""").format(columns=columns_json())


@dataclass(frozen=True)
class SnapshotTable:
    """A published table at the snapshot: what to copy, and how big it is now.

    ``columns`` are the published ones (a publication's column list applies); ``row_filter`` is
    the publications' row filters combined the way pgoutput applies them (OR; none when any
    publication has none). ``blocks`` is the heap's current size; ``reltuples`` and ``relpages``
    are the planner's estimates (``reltuples`` -1: never analyzed). A partitioned table's are
    its leaves' summed, and ``span`` is the block count of its biggest leaf: ctid ranges cut
    every leaf at once, so a range of ``[0, span)`` covers them all (a table's is ``blocks``).
    """

    table: TableRef
    relid: int
    relkind: str
    replica_identity: str
    columns: tuple[Column, ...]
    row_filter: str | None
    blocks: int
    reltuples: float
    relpages: int
    publications: tuple[str, ...]
    span: int
    # a partitioned table's leaves to read, named (a backfill's chunk: those its check found,
    # whatever is attached or detached before its readers plan); None: the table itself
    leaves: tuple[TableRef, ...] | None = None

    @property
    def key_names(self) -> tuple[str, ...]:
        """The replica identity's columns in table order (all of them under FULL)."""
        return tuple(c.name for c in self.columns if c.is_key)


@dataclass
class ExportedSnapshot:
    """A slot just created with an exported snapshot; holds the session that keeps it valid.

    Close it (or leave the ``with`` block) only after every reader ran ``SET TRANSACTION
    SNAPSHOT``: the server forgets the snapshot when this session ends or runs anything else.
    Closing does not drop the slot, except a temporary one.
    """

    slot: str
    consistent_point: LSN
    snapshot_name: str
    plugin: str
    temporary: bool
    failover: bool = False
    _stack: ExitStack = field(default_factory=ExitStack, repr=False, compare=False)

    def close(self) -> None:
        """End the exporting session (the snapshot can no longer be imported)."""
        self._stack.close()

    def __enter__(self) -> ExportedSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_slot_with_snapshot(
    params: dict[str, str], name: str, *, plugin: str = "pgoutput", temporary: bool = False,
    label: str = SOURCE_DSN_ENV, wait_s: float | None = None, failover: bool | None = False,
) -> ExportedSnapshot:  # fmt: skip
    """``CREATE_REPLICATION_SLOT name [TEMPORARY] LOGICAL plugin (SNAPSHOT 'export')``, with
    ``FAILOVER`` when the slot is to be synchronized to standbys
    (``models.failover.wants_failover``: None is wherever the server can).

    The statement waits until every transaction running when it started has finished (that is
    what makes the point consistent). The returned object holds the replication session it
    opened with ``params``; a temporary slot is dropped by the server when it closes. Raises
    ``SlotAlreadyExistsError``, ``ServerNotConfiguredError`` or ``InvalidSlotNameError``; with
    ``wait_s``, ``SnapshotWaitError`` once it has waited that long (the statement canceled).
    """
    validate_slot_name(name)
    stack = ExitStack()
    try:
        conn = stack.enter_context(connect(params, label=label, replication=True))
        as_failover = wants_failover(name, server_of(conn), conn.info.server_version,
                                     in_hot_standby=in_hot_standby(conn), requested=failover,
                                     temporary=temporary)  # fmt: skip
        statement = sql.SQL("CREATE_REPLICATION_SLOT {} {}LOGICAL {} (SNAPSHOT 'export'{})").format(
            sql.Identifier(name), sql.SQL("TEMPORARY " if temporary else ""),
            sql.Identifier(plugin), sql.SQL(", FAILOVER true" if as_failover else ""),
        )  # fmt: skip
        # the session must outlive the whole copy, idle: no configured timeout may end it
        set_session(conn, long_work_settings(conn.info.server_version))
        timer = None if wait_s is None else threading.Timer(wait_s, conn.cancel)
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            with slot_errors(name, setting=lambda s: show(conn, s), server=server_of(conn)):
                row = conn.execute(statement).fetchone()
        except psycopg.errors.QueryCanceled:
            raise SnapshotWaitError(name, wait_s or 0.0) from None
        finally:
            if timer is not None:
                timer.cancel()
    except BaseException:
        stack.close()
        raise
    assert row is not None
    exported = ExportedSnapshot(
        slot=row["slot_name"],
        consistent_point=LSN(row["consistent_point"]),
        snapshot_name=row["snapshot_name"],
        plugin=row["output_plugin"],
        temporary=temporary,
        failover=as_failover,
        _stack=stack,
    )
    log.info(
        "Created %slogical slot %s (plugin %s) at consistent point %s, exported snapshot %s",
        "temporary " if temporary else "failover " if as_failover else "", name, plugin,
        exported.consistent_point,
        exported.snapshot_name,
    )  # fmt: skip
    return exported


class SnapshotReader:
    """Sessions that import an exported snapshot, and the reads done inside them.

    Built from libpq parameters, not from an Airflow connection: Spark tasks construct it on the
    executors. ``label`` names the source in errors (never the password).
    """

    def __init__(
        self,
        params: Mapping[str, str],
        *,
        label: str = SOURCE_DSN_ENV,
        lock_timeout_ms: int = 0,
    ) -> None:
        self.params = {k: str(v) for k, v in params.items()}
        self.params.setdefault("application_name", "airflow-pglogrepl-snapshot")
        self.label = label
        self.lock_timeout_ms = lock_timeout_ms

    @contextmanager
    def transaction(self, snapshot_name: str) -> Iterator[psycopg.Connection[Any]]:
        """A read-only REPEATABLE READ transaction that sees exactly ``snapshot_name``.

        ``SET TRANSACTION SNAPSHOT`` must be the transaction's first statement after the
        isolation level, and takes a literal (no bound parameter): ``sql.Literal`` quotes it.
        See https://www.postgresql.org/docs/15/sql-set-transaction.html
        """
        validate_snapshot_name(snapshot_name)
        conn = connect(self.params, label=f"{self.label}, reading the snapshot")
        with conn:
            set_session(conn, READER_SETTINGS)
            set_session(conn, long_work_settings(conn.info.server_version))
            conn.autocommit = False
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
            try:
                yield conn
            finally:
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()  # read-only: nothing to keep

    def published_tables(
        self,
        conn: psycopg.Connection[Any],
        publications: Sequence[str],
        tables: Sequence[TableRef] | None = None,
    ) -> list[SnapshotTable]:
        """The tables ``publications`` publish (only ``tables`` when given), as pgoutput sees
        them at the snapshot. Raises ``ValueError`` for a table listed in ``tables`` that none
        of the publications publishes, or published with different column lists."""
        asked = {"publications": list(publications), "schemas": None, "names": None}
        if tables is not None:
            asked.update(schemas=[t.schema for t in tables], names=[t.name for t in tables])
        rows = conn.execute(_TABLES_QUERY, asked).fetchall()
        found = [_snapshot_table(row) for row in rows]
        if tables is None:
            return found
        by_ref = {t.table: t for t in found}
        missing = [str(t) for t in tables if t not in by_ref]
        if missing:
            raise ValueError(
                f"table(s) {', '.join(missing)} are not published by {list(publications)} at the "
                f"snapshot; add them to the publication (ALTER PUBLICATION ... ADD TABLE) first"
            )
        return [by_ref[t] for t in tables]

    def arrow_batches(
        self,
        snapshot_name: str,
        table: SnapshotTable,
        casts: Sequence[str | None],
        *,
        start_block: int = 0,
        stop_block: int | None = None,
        batch_bytes: int = 8 << 20,
    ) -> Iterator[pa.RecordBatch]:
        """The published columns of the rows in heap blocks ``[start_block, stop_block)`` (no
        upper bound when ``stop_block`` is None), seen in ``snapshot_name``, as Arrow record
        batches of about ``batch_bytes``, read one at a time.

        ``casts`` says per column how it is read: the name of a ``pg_catalog`` type to cast it
        to, whose binary form ADBC turns into the Arrow value the lake stores (``int8``,
        ``float8``, ``bool``, ``text`` ...), or None for the type's own text output (what
        pgoutput sends, printed with ``READER_SETTINGS``), NULL only for a NULL.

        ``ctid`` ranges use PostgreSQL's TID Range Scan: each range reads only its blocks. Rows
        visible in the snapshot sit in blocks that existed when it was taken, so a last range
        without an upper bound sees every row whatever the table grew to since.

        :raises SnapshotReadError: the session, the snapshot's import or the read failed (the
            text is the server's, without the password).
        """
        name = validate_snapshot_name(snapshot_name)
        queries = [q.as_string(None) for q in select_statements(table, casts, start_block,
                                                                 stop_block)]  # fmt: skip
        what = f"{self.label}: reading {table.table} in snapshot {name!r} failed"
        settings = {k: v for k, v in READER_SETTINGS.items() if k not in TEXT_OUTPUT}
        try:
            with adbc_session(
                self.params, what=what, lock_timeout_ms=self.lock_timeout_ms
            ) as session:
                session.set(settings)
                # ADBC's own transaction control (autocommit off) would send a plain BEGIN
                # before anything could follow it; the snapshot must be imported as the
                # transaction's first statement after its isolation level.
                session.run("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                session.run(
                    sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)).as_string(None)
                )
                for query in queries:
                    yield from session.batches(query, batch_bytes=batch_bytes)
        except AdbcError as exc:
            text = str(exc)
            # 15 to 17 say "invalid snapshot identifier", 18 'snapshot "..." does not exist'
            if "invalid snapshot identifier" in text or re.search(
                r'snapshot "[^"]*" does not exist', text
            ):
                text += (
                    ". The exported snapshot no longer exists. Fix: an exported snapshot lives "
                    "only while the session that created the slot stays open, and the snapshot "
                    "job holds it until every task has read; run the snapshot again"
                )
            elif "lock timeout" in text:
                text += (
                    ". A statement waiting for an exclusive lock on the table (VACUUM FULL, "
                    "CLUSTER, ALTER TABLE) queued ahead of this reader, and the snapshot could "
                    "not cancel it (its role needs pg_signal_backend). Fix: end that statement "
                    "and run the snapshot again"
                )
            elif "password" in text and "passfile" in self.params:
                text += f". Note: {PASSFILE_HINT}"
            raise SnapshotReadError(text) from None


def validate_snapshot_name(name: str) -> str:
    """``name`` when it has the form PostgreSQL gives an exported snapshot's name
    (``pg_export_snapshot``: hex backend and transaction numbers, a sequence number)."""
    if not _SNAPSHOT_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not the name of an exported snapshot (like '00000003-0000001B-1')"
        )
    return name


def select_statements(
    table: SnapshotTable,
    casts: Sequence[str | None],
    start_block: int = 0,
    stop_block: int | None = None,
) -> list[sql.Composed]:
    """What reads the range: ``select_statement``, or for a partitioned table with ``leaves``
    named, one for each leaf (``ONLY``; none for none): run one after the other in the same
    snapshot, each is a statement of its own size, however many leaves there are."""
    if table.leaves is None:
        return [select_statement(table, casts, start_block, stop_block)]
    return [
        select_statement(
            dataclasses.replace(table, table=leaf, relkind="r", leaves=None),
            casts,
            start_block,
            stop_block,
        )
        for leaf in table.leaves
    ]


def select_statement(
    table: SnapshotTable,
    casts: Sequence[str | None],
    start_block: int = 0,
    stop_block: int | None = None,
) -> sql.Composed:
    """``SELECT <published columns, cast or as text> FROM ONLY <table> WHERE <range> [AND
    <filter>]``.

    A column read as text is ``format('%s', c)``: the type's output function, as pgoutput
    and ``COPY`` call it (``c::text`` is a different function for ``inet`` and ``xml``), NULL
    only when the value is (``num_nulls``: a composite of NULL fields ``IS NULL`` too). Both
    are named with their schema: they take ``"any"``, so a function of the same name with the
    column's exact type in a schema on the search path would be chosen over them. A
    partitioned table's range is read from each leaf (each has ctids of its own; PostgreSQL
    scans each leaf's blocks of the range only).
    ``ONLY``: an inheritance child is published (and copied) as a table of its own. The row
    filter is the expression PostgreSQL itself printed (``pg_get_expr``), as logical
    replication's own table synchronization uses it.
    """
    if len(casts) != len(table.columns):
        raise ValueError(
            f"{len(casts)} casts for the {len(table.columns)} columns of {table.table}"
        )
    columns = []
    for column, cast in zip(table.columns, casts, strict=True):
        name = sql.Identifier(column.name)
        if cast is None:  # pg_catalog's functions named: "any" arguments lose to a user's
            value = sql.SQL(
                "CASE WHEN pg_catalog.num_nulls({0}) OPERATOR(pg_catalog.=) 0"
                " THEN pg_catalog.format('%s'::pg_catalog.text, {0}) END"
            ).format(name)
        else:
            value = sql.SQL("{}::{}").format(name, sql.Identifier("pg_catalog", cast))
        columns.append(sql.SQL("{} AS {}").format(value, name))
    conditions: list[sql.Composable] = []
    if start_block > 0:
        conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({int(start_block)},0)")))
    if stop_block is not None:
        conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({int(stop_block)},0)")))
    if table.row_filter:
        conditions.append(sql.SQL("({})").format(sql.SQL(table.row_filter)))
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    return sql.SQL("SELECT {columns} FROM {only}{table}{where}").format(
        columns=sql.SQL(", ").join(columns),
        only=sql.SQL("" if table.relkind == "p" else "ONLY "),
        table=sql.Identifier(table.table.schema, table.table.name),
        where=where,
    )


def _snapshot_table(row: dict[str, Any]) -> SnapshotTable:
    ref = TableRef(row["schema_name"], row["table_name"])
    publications = row["publications"]
    lists = {tuple(p["columns"]) for p in publications if p["columns"] is not None}
    if len(lists) > 1:
        raise ValueError(
            f"table {ref} is published with different column lists by "
            f"{[p['publication'] for p in publications]}; pgoutput refuses that too"
        )
    published = set(next(iter(lists))) if lists else None
    identity = row["replica_identity"]
    key_attnums = set(row["key_attnums"])
    columns = tuple(
        # pgoutput flags every column as key under REPLICA IDENTITY FULL
        dataclasses.replace(c, is_key=identity == "f" or c.attnum in key_attnums)
        for c in columns_from_json(row["columns"])
        # what pgoutput sends: no generated column, only the published ones
        if not c.generated and (published is None or c.name in published)
    )
    filters = [p["row_filter"] for p in publications]
    row_filter = None
    if filters and all(filters):
        row_filter = " OR ".join(f"({f})" for f in dict.fromkeys(filters))
    return SnapshotTable(
        table=ref,
        relid=row["relid"],
        relkind=row["relkind"],
        replica_identity=identity,
        columns=columns,
        row_filter=row_filter,
        blocks=int(row["blocks"]),
        reltuples=float(row["reltuples"]),
        relpages=int(row["relpages"]),
        publications=tuple(p["publication"] for p in publications),
        span=int(row["span"]),
    )
