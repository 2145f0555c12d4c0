"""``PgLogicalReplicationHook`` puts every mixin together under the ``pglogrepl`` connection
type; ``DsnReplicationHook`` is the same hook for a libpq DSN, whose label (never the DSN, which
holds the password) names it in errors."""

from __future__ import annotations

import asyncio

import pytest

from airflow_pglogrepl.conninfo import SOURCE_DSN_ENV, make_dsn
from airflow_pglogrepl.exceptions import ConnectionFailedError
from airflow_pglogrepl.hooks.base import PgSessionHook
from airflow_pglogrepl.hooks.catalog import CatalogMixin
from airflow_pglogrepl.hooks.conflicts import ConflictsMixin
from airflow_pglogrepl.hooks.fence import FenceMixin
from airflow_pglogrepl.hooks.locks import WriterLockMixin
from airflow_pglogrepl.hooks.parity import ParityMixin
from airflow_pglogrepl.hooks.publications import PublicationsMixin
from airflow_pglogrepl.hooks.replication import DsnReplicationHook, PgLogicalReplicationHook
from airflow_pglogrepl.hooks.sequences import SequencesMixin
from airflow_pglogrepl.hooks.server import ServerMixin
from airflow_pglogrepl.hooks.slots import SlotsMixin
from airflow_pglogrepl.hooks.snapshot import SnapshotMixin
from airflow_pglogrepl.hooks.subscriptions import SubscriptionsMixin
from airflow_pglogrepl.testing.pgcluster import PgCluster

MIXINS = (SnapshotMixin, WriterLockMixin, FenceMixin, SequencesMixin, ParityMixin,
          ConflictsMixin, CatalogMixin, PublicationsMixin, SubscriptionsMixin, SlotsMixin,
          ServerMixin)  # fmt: skip


def test_the_hook_is_every_mixin_under_its_connection_type() -> None:
    assert all(issubclass(PgLogicalReplicationHook, m) for m in MIXINS)
    assert issubclass(PgLogicalReplicationHook, PgSessionHook)
    assert PgLogicalReplicationHook.conn_type == "pglogrepl"
    assert PgLogicalReplicationHook.hook_name == "PostgreSQL logical replication"
    assert issubclass(DsnReplicationHook, PgLogicalReplicationHook)


def test_a_dsn_hook_s_parameters_are_the_dsn_s_and_its_label_names_it() -> None:
    hook = DsnReplicationHook("host=h port=5433 user=u password=pw dbname='my db'", label="SRC")
    params = hook.connection_params()
    assert {k: params[k] for k in ("host", "port", "user", "password", "dbname")} == {
        "host": "h", "port": "5433", "user": "u", "password": "pw", "dbname": "my db"
    }  # fmt: skip
    params["password"] = "changed"  # a copy: the hook's own stay as they were
    assert hook.connection_params()["password"] == "pw"
    assert asyncio.run(hook.aconnection_params()) == hook.connection_params()
    assert hook.get_conn_id() == "SRC"
    assert DsnReplicationHook("host=h").get_conn_id() == SOURCE_DSN_ENV


def test_a_dsn_hook_reaches_its_server_and_a_failed_login_names_the_label_not_the_dsn(
    publisher: PgCluster,
) -> None:
    assert DsnReplicationHook(publisher.dsn()).database_name() == "postgres"
    wrong = make_dsn({**publisher.params(), "password": "wr0ng-pw"})
    with pytest.raises(ConnectionFailedError, match="password authentication failed") as caught:
        DsnReplicationHook(wrong, label="THE_SOURCE_DSN").database_name()
    assert "(THE_SOURCE_DSN)" in str(caught.value) and "wr0ng-pw" not in str(caught.value)
    assert "Airflow connection" not in str(caught.value)  # it is a DSN, named as given
