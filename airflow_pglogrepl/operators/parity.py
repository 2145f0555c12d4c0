"""Table parity between publisher and subscriber: row counts and order-independent checksums.

The cutover's last gate before anything is dropped. Each table's count and checksum are computed
in SQL on each server (``PgLogicalReplicationHook.table_checksum``), both sides and several tables
at once in threads; only two numbers per table and side travel back.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.operators.arguments import names, resolve_tables

if TYPE_CHECKING:
    from concurrent.futures import Future

    from airflow_pglogrepl.hooks.parity import TableChecksum
    from airflow_pglogrepl.tables import TableRef


@dataclass(frozen=True)
class TableParity:
    """One table compared: ``problem`` is ``None`` when both sides match."""

    table: TableRef
    publisher: TableChecksum | None
    subscriber: TableChecksum | None
    problem: str | None

    def to_dict(self) -> dict[str, Any]:
        pub, sub = self.publisher, self.subscriber
        return {
            "table": str(self.table),
            "publisher_rows": pub.rows if pub else None,
            "subscriber_rows": sub.rows if sub else None,
            "row_difference": sub.rows - pub.rows if pub and sub else None,
            # Checksums are up to ~2^63 per row summed: text keeps them exact in JSON.
            "publisher_checksum": str(pub.checksum) if pub else None,
            "subscriber_checksum": str(sub.checksum) if sub else None,
            "match": self.problem is None,
            "problem": self.problem,
        }


def compare(
    table: TableRef, publisher: TableChecksum | None, subscriber: TableChecksum | None
) -> TableParity:
    """Judge one table; the problem says by how much the sides differ."""
    if publisher is None or subscriber is None:
        side = "publisher" if publisher is None else "subscriber"
        return TableParity(table, publisher, subscriber, f"missing on the {side}")
    diff = subscriber.rows - publisher.rows
    if diff:
        word = "more" if diff > 0 else "fewer"
        noun = "row" if abs(diff) == 1 else "rows"
        return TableParity(
            table, publisher, subscriber,
            f"subscriber has {abs(diff)} {noun} {word} ({subscriber.rows} vs {publisher.rows} on "
            f"the publisher)",
        )  # fmt: skip
    if subscriber.checksum != publisher.checksum:
        return TableParity(
            table, publisher, subscriber,
            f"same row count ({publisher.rows}) but checksums differ: at least one row's "
            f"content differs",
        )  # fmt: skip
    return TableParity(table, publisher, subscriber, None)


class TableParityCheckOperator(TaskBoundary, BaseOperator):
    """Fail unless every table has the same rows on publisher and subscriber.

    Per table: ``count(*)`` and the sum of each row's md5 (folded to 64 bits), computed on both
    servers over the publisher's replicated columns (by name, so column order does not matter;
    extra subscriber columns are ignored). Up to ``parallelism`` checksums run at once, each in
    its own session. Run it after the write fence and the catch-up sensor, when neither side
    changes. The report (one entry per table: counts, difference, checksums) is pushed to XCom
    either way; the failure names each differing table and by how much.

    :param publisher_conn_id: Airflow connection of the publisher.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param tables: tables to compare (``schema.table``).
    :param publication: compare every table of this publication too.
    :param parallelism: checksum queries running at once (over both servers).
    :param publisher_database: publisher database, when not the connection's.
    :param subscriber_database: subscriber database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "tables", "publication", "publisher_conn_id", "subscriber_conn_id",
        "publisher_database", "subscriber_database",
    )  # fmt: skip
    ui_color = "#fcf3cf"

    def __init__(
        self,
        *,
        publisher_conn_id: str,
        subscriber_conn_id: str,
        tables: str | Sequence[str] | None = None,
        publication: str | None = None,
        parallelism: int = 4,
        publisher_database: str | None = None,
        subscriber_database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not tables and not publication:
            raise ValueError("TableParityCheckOperator: give tables, a publication, or both")
        if parallelism < 1:
            raise ValueError(f"parallelism must be at least 1, not {parallelism}")
        self.publisher_conn_id = publisher_conn_id
        self.subscriber_conn_id = subscriber_conn_id
        self.tables = tables
        self.publication = publication
        self.parallelism = parallelism
        self.publisher_database = publisher_database
        self.subscriber_database = subscriber_database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import ParityMismatchError

        publisher = replication_hook(self.publisher_conn_id, self.publisher_database)
        subscriber = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        tables = resolve_tables(publisher, names(self.tables), self.publication)
        pub_columns = publisher.table_columns(tables)
        sub_columns = subscriber.table_columns(tables)

        # Both hooks have looked their connection up by now (table_columns), in this thread:
        # the worker threads below only open sessions with it.
        results: dict[TableRef, TableParity] = {}
        jobs: dict[TableRef, tuple[Future[TableChecksum], Future[TableChecksum]]] = {}
        with ThreadPoolExecutor(max_workers=self.parallelism, thread_name_prefix="parity") as pool:
            for table in tables:
                columns = pub_columns.get(table)
                theirs = sub_columns.get(table)
                if columns is None or theirs is None:
                    side = "publisher" if columns is None else "subscriber"
                    results[table] = TableParity(table, None, None, f"missing on the {side}")
                    continue
                lacking = [c for c in columns if c not in theirs]
                if lacking:
                    results[table] = TableParity(
                        table, None, None, f"columns missing on the subscriber: {lacking}"
                    )
                    continue
                jobs[table] = (
                    pool.submit(publisher.table_checksum, table, columns),
                    pool.submit(subscriber.table_checksum, table, columns),
                )
            for table, (pub_job, sub_job) in jobs.items():
                results[table] = compare(table, pub_job.result(), sub_job.result())

        ordered = [results[t] for t in tables]
        differing = [r for r in ordered if r.problem is not None]
        for result in ordered:
            self.log.info(
                "%s: %s", result.table,
                "match" if result.problem is None else f"DIFFERS: {result.problem}",
            )  # fmt: skip
        report = {
            "tables": [r.to_dict() for r in ordered],
            "checked": len(ordered),
            "differing": [str(r.table) for r in differing],
            "passed": not differing,
        }
        if differing:
            context["ti"].xcom_push(key="return_value", value=report)
            raise ParityMismatchError(len(ordered), [f"{r.table}: {r.problem}" for r in differing])
        return report
