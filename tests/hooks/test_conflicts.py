"""Apply errors through the hook, on a subscription created without connecting (no worker, no
slot) and a slot of the same database: what a missing subscription reads as, what the
subscriber tells of one, a skip set and withdrawn (and, before PostgreSQL 15, the origin moved
with the subscription left as it was), and the first unapplied transaction peeked from the slot
without consuming it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_pglogrepl.exceptions import ObjectNotFoundError
from airflow_pglogrepl.hooks import conflicts as module
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.versions import Features
from tests.support.databases import Database

pytestmark = pytest.mark.pgversion  # SKIP came with 15, conflict counters with 18
NAME = 'Sub "x"; y'


@pytest.fixture
def subscribed(database: Database) -> Iterator[Database]:
    database.sql(
        'CREATE SUBSCRIPTION "Sub ""x""; y" CONNECTION \'dbname=nowhere\''
        ' PUBLICATION p, "q\'" WITH (connect = false)'
    )
    yield database
    database.sql('ALTER SUBSCRIPTION "Sub ""x""; y" SET (slot_name = NONE)')
    database.sql('DROP SUBSCRIPTION "Sub ""x""; y"')


def test_a_missing_subscription_reads_as_missing_and_is_not_skipped(database: Database) -> None:
    hook = database.hook
    assert not hook.subscription_errors("no such sub").exists
    for call in (lambda: hook.skip_transaction("no such sub", LSN("0/1")),
                 lambda: hook.clear_skip("no such sub")):  # fmt: skip
        with pytest.raises(ObjectNotFoundError, match="subscription 'no such sub' does not"):
            call()


def test_what_the_subscriber_tells_and_a_skip_set_and_withdrawn(subscribed: Database) -> None:
    hook = subscribed.hook
    errors = hook.subscription_errors(NAME)
    assert (errors.exists, errors.enabled, errors.slot_name) == (True, False, NAME)
    assert errors.publications == ("p", "q'") and errors.apply_worker_pid is None
    assert (errors.skip_lsn, errors.origin_lsn, errors.sync_workers) == (None, None, ())
    assert (errors.apply_error_count, errors.sync_error_count) == (0, 0)
    assert hook.skip_transaction(NAME, LSN("0/1234ABC")) == "skip"
    assert hook.subscription_errors(NAME).skip_lsn == LSN("0/1234ABC")
    hook.clear_skip(NAME)
    assert hook.subscription_errors(NAME).skip_lsn is None
    hook.reset_subscription_error_stats(NAME)


def test_without_skip_the_origin_is_moved_and_the_subscription_left_as_it_was(
    subscribed: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL 14 has no SKIP: the origin is advanced instead (a disabled subscription is
    not enabled by it)."""

    class WithoutSkip(Features):
        @property
        def subscription_skip(self) -> bool:
            return False

    monkeypatch.setattr(module, "Features", WithoutSkip)
    hook = subscribed.hook
    assert hook.skip_transaction(NAME, LSN("0/5000000")) == "origin"
    errors = hook.subscription_errors(NAME)
    assert errors.origin_lsn == LSN("0/5000000") and errors.skip_lsn is None
    assert errors.enabled is False


def test_the_first_unapplied_transaction_is_peeked_not_consumed(
    database: Database, slot_name: str
) -> None:
    hook = database.hook
    database.sql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    hook.create_logical_slot(slot_name)
    try:
        for transaction in ("INSERT INTO t VALUES (1), (2)", "DELETE FROM t WHERE id = 1",
                            "INSERT INTO t VALUES (3)"):  # fmt: skip
            database.sql(transaction)
        first = hook.pending_transaction(slot_name, ["pub"], applied_upto=None)
        assert first is not None and first.complete
        assert first.changes == ((TableRef("public", "t"), "insert", 2),)
        assert hook.pending_transaction(slot_name, ["pub"], applied_upto=None) == first
        second = hook.pending_transaction(slot_name, ["pub"], applied_upto=first.finish_lsn + 1)
        assert second is not None and second.finish_lsn > first.finish_lsn
        assert second.changes == ((TableRef("public", "t"), "delete", 1),)
        late = hook.current_wal_lsn()
        assert hook.pending_transaction(slot_name, ["pub"], applied_upto=late) is None
    finally:
        hook.drop_slot(slot_name)
