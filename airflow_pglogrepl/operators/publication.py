"""Create (idempotently) and drop publications on the publisher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook

PUBLISH_ALL = ("insert", "update", "delete", "truncate")


class CreatePublicationOperator(TaskBoundary, BaseOperator):
    """Create a publication, or make an existing one match this definition.

    Re-running with the same definition changes nothing. A changed table list is reconciled
    (tables added or dropped, logged); a definition that cannot be reconciled in place
    (``all_tables`` against a list) fails and says what differs.

    :param publication: publication name (any characters; quoted as an identifier).
    :param postgres_conn_id: the publisher's Airflow connection.
    :param tables: tables to publish (``"schema.table"``, quoted parts allowed).
    :param all_tables: publish every table (``FOR ALL TABLES``); only when asked explicitly.
    :param publish: operations to publish (subset of insert, update, delete, truncate).
    :param publish_via_partition_root: publish partition changes as the root table's.
    :param row_filters: per table, a ``WHERE`` expression (PostgreSQL 15+). It is SQL written
        by the DAG author: not templated (a DAG run's ``conf`` can never supply one), and
        checked to be one parenthesis-balanced expression (``row_filter.check_row_filter``).
    :param column_lists: per table, the columns to publish (PostgreSQL 15+).
    :param database: the database on the publisher, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "publication", "postgres_conn_id", "database", "tables", "column_lists",
    )  # fmt: skip
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        publication: str,
        postgres_conn_id: str,
        tables: Sequence[str] | None = None,
        all_tables: bool = False,
        publish: Sequence[str] = PUBLISH_ALL,
        publish_via_partition_root: bool = False,
        row_filters: Mapping[str, str] | None = None,
        column_lists: Mapping[str, Sequence[str]] | None = None,
        database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if all_tables and tables:
            raise ValueError(
                f"publication {publication!r}: give tables or all_tables=True, not both"
            )
        if not all_tables and not tables:
            raise ValueError(
                f"publication {publication!r}: give a table list (all_tables=True publishes "
                f"every table, including ones created later, and must be asked for explicitly)"
            )
        self.publication = publication
        self.postgres_conn_id = postgres_conn_id
        self.tables = tables or []
        self.all_tables = all_tables
        self.publish = publish
        self.publish_via_partition_root = publish_via_partition_root
        self.row_filters = row_filters or {}
        self.column_lists = column_lists or {}
        self.database = database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.models.records import PublishedTable
        from airflow_pglogrepl.tables import TableRef, parse_tables

        refs = parse_tables(self.tables)
        filters = {TableRef.parse(k): v for k, v in self.row_filters.items()}
        columns = {TableRef.parse(k): tuple(v) for k, v in self.column_lists.items()}
        unknown = (filters.keys() | columns.keys()) - set(refs)
        if unknown:
            raise ValueError(
                f"publication {self.publication!r}: row_filters/column_lists name tables not in "
                f"the table list: {', '.join(map(str, sorted(unknown)))}"
            )
        hook = replication_hook(self.postgres_conn_id, self.database)
        result = hook.ensure_publication(
            self.publication,
            tables=[PublishedTable(t, columns.get(t), filters.get(t)) for t in refs],
            all_tables=self.all_tables,
            publish=self.publish,
            via_root=self.publish_via_partition_root,
        )
        return result.to_dict()


class DropPublicationOperator(TaskBoundary, BaseOperator):
    """Drop a publication; succeeds when it is already gone.

    :param publication: publication name.
    :param postgres_conn_id: the publisher's Airflow connection.
    :param database: the database on the publisher, when not the connection's.
    """

    template_fields: Sequence[str] = ("publication", "postgres_conn_id", "database")

    def __init__(
        self,
        *,
        publication: str,
        postgres_conn_id: str,
        database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.publication = publication
        self.postgres_conn_id = postgres_conn_id
        self.database = database

    def execute(self, context: Context) -> dict[str, Any]:
        hook = replication_hook(self.postgres_conn_id, self.database)
        dropped = hook.drop_publication(self.publication, missing_ok=True)
        return {"publication": self.publication, "dropped": dropped}
