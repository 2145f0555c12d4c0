"""A publisher database and a subscriber database for the cutover toolkit's live tests."""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from airflow_pglogrepl.conninfo import make_dsn
from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
from airflow_pglogrepl.operators.publication import CreatePublicationOperator
from airflow_pglogrepl.operators.subscription import CreateSubscriptionOperator
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.airflow import context, set_airflow_connection

_ids = itertools.count(1)
HOSTILE_TABLE = 'Ordërs; "x" tbl'
HOSTILE_TABLE_SQL = '"Ordërs; ""x"" tbl"'


@dataclass
class Pair:
    """A publisher database and a subscriber database, Airflow connections, roles to clean up."""

    publisher: PgCluster
    pub_db: str
    subscriber: PgCluster
    sub_db: str
    pub_conn: str
    sub_conn: str
    roles: list[str] = field(default_factory=list)

    def pub(self, statement: Any, params: Any = None) -> list[Any]:
        return self.publisher.execute(statement, params, dbname=self.pub_db)

    def sub(self, statement: Any, params: Any = None) -> list[Any]:
        return self.subscriber.execute(statement, params, dbname=self.sub_db)

    def both(self, statement: Any) -> None:
        self.pub(statement)
        self.sub(statement)

    def role(self, label: str) -> tuple[str, str]:
        """A new login role on the publisher with a hostile name; returns (name, password)."""
        name = f'{label} "rôle"; {next(_ids)}-{secrets.token_hex(3)}'
        password = secrets.token_urlsafe(12)
        self.pub(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
        self.roles.append(name)
        return name, password

    def connect_as(self, role: str, password: str) -> psycopg.Connection[Any]:
        params = {**self.publisher.params(self.pub_db), "user": role, "password": password}
        return psycopg.connect(make_dsn(params), autocommit=True)

    def pub_hook(self) -> PgLogicalReplicationHook:
        return PgLogicalReplicationHook(postgres_conn_id=self.pub_conn)

    def sub_hook(self) -> PgLogicalReplicationHook:
        return PgLogicalReplicationHook(postgres_conn_id=self.sub_conn)


def subscribe(pair: Pair, publication: str, subscription: str, tables: list[str]) -> None:
    CreatePublicationOperator(
        task_id="pub", publication=publication, postgres_conn_id=pair.pub_conn, tables=tables
    ).execute(context())
    CreateSubscriptionOperator(
        task_id="sub", subscription=subscription, publications=[publication],
        publisher_conn_id=pair.pub_conn, subscriber_conn_id=pair.sub_conn,
    ).execute(context())  # fmt: skip
    hook = pair.sub_hook()
    wait_until(
        lambda: hook.subscription_status(subscription).state_counts == {"r": len(tables)},
        what=f"{subscription} ready",
    )


def conn_as(pair: Pair, role: str, password: str) -> str:
    """An Airflow connection id for ``role`` on the publisher database."""
    from urllib.parse import quote

    conn_id = f"as_{next(_ids)}"
    cluster = pair.publisher
    set_airflow_connection(conn_id, f"postgres://{quote(role, safe='')}:"
                           f"{quote(password, safe='')}@{cluster.host}:{cluster.port}/"
                           f"{pair.pub_db}")  # fmt: skip
    return conn_id


HOSTILE = TableRef('Sales "Q1"', "Ordërs; drop")
