"""Fixtures of the operator tests: a publisher and a subscriber database for the cutover toolkit."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from psycopg import sql

from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import set_airflow_connection
from tests.support.cutover import Pair

_pairs = itertools.count(1)


@pytest.fixture
def pair(publisher: PgCluster, subscriber: PgCluster) -> Iterator[Pair]:
    n = next(_pairs)
    pub_db, sub_db = f"cutover_pub_{n}", f"cutover_sub_{n}"
    publisher.create_database(pub_db)
    subscriber.create_database(sub_db)
    set_airflow_connection(f"cutover_pub_{n}", publisher.airflow_uri(pub_db))
    set_airflow_connection(f"cutover_sub_{n}", subscriber.airflow_uri(sub_db))
    p = Pair(publisher, pub_db, subscriber, sub_db, f"cutover_pub_{n}", f"cutover_sub_{n}")
    yield p
    # Subscriptions hold slots and workers (either direction after a finalize): drop them.
    for hook, run in ((p.sub_hook(), p.sub), (p.pub_hook(), p.pub)):
        mine = run(
            "SELECT subname FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid"
            " WHERE d.datname = current_database()"
        )
        for (name,) in mine:
            hook.drop_subscription(str(name))
    for role in p.roles:
        p.pub(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        p.pub(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
