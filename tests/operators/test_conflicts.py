"""Apply conflicts: the subscription's problems, the skip LSN never guessed, and on live clusters
a conflict reported with its relation and skipped only given the LSN.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_pglogrepl.exceptions import InvalidLSNError, ReplicationFailedError
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.models.records import RelState, SubscriptionErrors
from airflow_pglogrepl.operators.conflicts import (
    SkipConflictingTransactionOperator,
    SubscriptionErrorCheckOperator,
    parse_skip_lsn,
    subscription_problems,
)
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.airflow import FakeTI, context
from tests.support.boundary import task_fails_with
from tests.support.cutover import Pair, subscribe


def _errors(**kw: Any) -> SubscriptionErrors:
    defaults: dict[str, Any] = {"name": "sub", "exists": True, "enabled": True,
                                "apply_error_count": 0, "sync_error_count": 0}  # fmt: skip
    return SubscriptionErrors(**{**defaults, **kw})


def _problems(errors: SubscriptionErrors, worker_seen: bool = True) -> list[str]:
    return subscription_problems(
        errors, max_apply_errors=0, max_sync_errors=0, worker_seen=worker_seen,
        fail_if_disabled=True,
    )  # fmt: skip


def test_subscription_problems() -> None:
    assert _problems(_errors()) == []
    assert _problems(_errors(exists=False)) == [
        "subscription 'sub' does not exist on the subscriber"
    ]
    reset = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    apply = _problems(_errors(apply_error_count=3, stats_reset=reset), worker_seen=False)
    assert apply[0].startswith("3 apply error(s) since 2026-01-01")
    assert "apply worker is not running" in apply[1]
    stuck = RelState(TableRef("public", "big"), "d", None)
    sync = _problems(_errors(sync_error_count=2, not_ready=(stuck,)))
    assert sync == ["2 table sync error(s) (sync_error_count, allowed 0); tables not ready: "
                    "public.big (state d)"]  # fmt: skip
    assert "disabled" in _problems(_errors(enabled=False), worker_seen=False)[0]
    assert "subskiplsn" in _problems(_errors(skip_lsn=LSN("0/5")))[0]
    # Counters from before PostgreSQL 15 are unknown (None): not an error by themselves.
    assert _problems(_errors(apply_error_count=None, sync_error_count=None)) == []


@pytest.mark.parametrize("value", [None, "", "  ", "none", "NONE"])
def test_skip_lsn_is_never_guessed(value: object) -> None:
    with pytest.raises(ValueError, match="explicitly"):
        parse_skip_lsn(value)


def test_skip_lsn_must_be_a_real_lsn() -> None:
    assert parse_skip_lsn(" 16/B374D848 ") == LSN("16/B374D848")
    with pytest.raises(ValueError, match="0/0"):
        parse_skip_lsn("0/0")
    with pytest.raises(InvalidLSNError):
        parse_skip_lsn("yesterday")


def test_skip_operator_requires_the_lsn_when_the_dag_is_parsed() -> None:
    kwargs: dict[str, Any] = {"task_id": "skip", "subscription": "s", "subscriber_conn_id": "c"}
    with pytest.raises(TypeError):
        SkipConflictingTransactionOperator(**kwargs)
    with pytest.raises(ValueError, match="explicitly"):
        SkipConflictingTransactionOperator(**kwargs, lsn="")
    templated = SkipConflictingTransactionOperator(
        **kwargs, lsn="{{ params.finish_lsn }}"
    )  # checked after rendering, in execute
    assert templated.lsn == "{{ params.finish_lsn }}" and "lsn" in templated.template_fields


# The tests below depend on the server's major version: make test runs them on 15 to 18.


# -- apply conflicts -----------------------------------------------------------------------------

_FINISHED_AT = re.compile(
    r'replication target relation "public\.conflict_t" in transaction (\d+), '
    r"finished at ([0-9A-F]+/[0-9A-F]+)"
)


@pytest.mark.pgversion
def test_apply_conflict_is_reported_with_its_relation_and_skipped_only_given_the_lsn(
    pair: Pair,
) -> None:
    pair.both("CREATE TABLE conflict_t (id int PRIMARY KEY, v text)")
    pair.both("CREATE TABLE calm_t (id int PRIMARY KEY)")
    pair.pub("INSERT INTO conflict_t SELECT g, 'initial' FROM generate_series(1, 10) g")
    subscribe(pair, "conflict_pub", "conflict_sub", ["conflict_t", "calm_t"])
    pair.pub("INSERT INTO conflict_t VALUES (11, 'streamed')")  # moves the origin past the copy
    wait_until(lambda: pair.sub("SELECT count(*) FROM conflict_t") == [(11,)], what="apply")

    def check() -> SubscriptionErrorCheckOperator:
        return SubscriptionErrorCheckOperator(
            task_id="check", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
            publisher_conn_id=pair.pub_conn, worker_grace_period=10,
        )  # fmt: skip

    assert check().execute(context())["problems"] == []

    pair.sub("INSERT INTO conflict_t VALUES (100, 'planted on the subscriber')")
    with pair.publisher.connect(pair.pub_db) as conn, conn.transaction():
        conn.execute("INSERT INTO calm_t VALUES (1)")
        conn.execute("INSERT INTO conflict_t VALUES (100, 'from the publisher'), (101, 'too')")
    hook = pair.sub_hook()
    wait_until(lambda: (hook.subscription_errors("conflict_sub").apply_error_count or 0) >= 1,
               what="apply error counted")  # fmt: skip

    ti = FakeTI()
    with pytest.raises(AirflowFailException) as failure:
        check().execute(context(ti))
    report = ti.pushed["return_value"]
    assert report["relations_involved"] == ["public.calm_t", "public.conflict_t"]
    pending = report["pending_transaction"]
    assert {c["table"]: c["count"] for c in pending["changes"]} == {
        "public.calm_t": 1, "public.conflict_t": 2}  # fmt: skip
    assert "public.conflict_t (2 insert)" in str(failure.value)
    assert "apply error" in str(failure.value)

    # The finish LSN, as the operator is told it: from the subscriber's server log.
    match = wait_until(lambda: _FINISHED_AT.search(pair.subscriber.logfile.read_text()),
                       what="the conflict in the subscriber log")  # fmt: skip
    assert match is not None
    xid, logged_lsn = match.group(1), match.group(2)
    assert logged_lsn == pending["finish_lsn"] and int(xid) == pending["xid"]

    for missing in ("", None, "None"):
        with pytest.raises(ValueError, match="explicitly"):
            SkipConflictingTransactionOperator(
                task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
                lsn=missing,  # type: ignore[arg-type]
            )  # fmt: skip
    with pytest.raises(TypeError):
        SkipConflictingTransactionOperator(  # type: ignore[call-arg]
            task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn
        )
    with pytest.raises(Exception, match="origin LSN"):  # behind what was applied: refused
        SkipConflictingTransactionOperator(
            task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
            lsn="0/1",
        ).execute(context())  # fmt: skip
    with task_fails_with(ReplicationFailedError, match="withdrawn"):  # not that transaction's
        SkipConflictingTransactionOperator(
            task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
            lsn=str(LSN(logged_lsn) + 8), wait_timeout=6,
        ).execute(context())  # fmt: skip
    errors = hook.subscription_errors("conflict_sub")
    assert errors.skip_lsn is None and (errors.apply_error_count or 0) >= 1
    assert pair.sub("SELECT count(*) FROM calm_t") == [(0,)]

    skipped = SkipConflictingTransactionOperator(
        task_id="skip", subscription="conflict_sub", subscriber_conn_id=pair.sub_conn,
        lsn=logged_lsn,
    ).execute(context())  # fmt: skip
    assert skipped == {"subscription": "conflict_sub", "lsn": logged_lsn, "method": "skip",
                       "skipped": True}  # fmt: skip
    pair.pub("INSERT INTO conflict_t VALUES (102, 'after the skip')")
    wait_until(lambda: pair.sub("SELECT id, v FROM conflict_t WHERE id >= 100 ORDER BY id")
               == [(100, "planted on the subscriber"), (102, "after the skip")],
               what="replication resumed past the skipped transaction")  # fmt: skip
    assert pair.sub("SELECT count(*) FROM calm_t") == [(0,)]  # the whole transaction was skipped
    assert check().execute(context())["problems"] == []


@pytest.mark.pgversion
def test_a_silently_skipped_update_fails_the_check_where_the_server_counts_it(pair: Pair) -> None:
    """PostgreSQL 18 counts conflicts the apply worker resolves by itself: an update of a row
    the subscriber lacks is skipped without an error, and the subscriber has diverged. The
    check fails on it there; older servers do not count it (conflicts is None)."""
    pair.both("CREATE TABLE diverge_t (id int PRIMARY KEY, v text)")
    pair.pub("INSERT INTO diverge_t SELECT g, 'initial' FROM generate_series(1, 5) g")
    subscribe(pair, "diverge_pub", "diverge_sub", ["diverge_t"])
    pair.sub("DELETE FROM diverge_t WHERE id = 3")  # a row only the publisher has now
    pair.pub("UPDATE diverge_t SET v = 'changed' WHERE id IN (3, 4)")
    wait_until(lambda: pair.sub("SELECT v FROM diverge_t WHERE id = 4") == [("changed",)],
               what="the update applied")  # fmt: skip
    hook = pair.sub_hook()
    check = SubscriptionErrorCheckOperator(
        task_id="check", subscription="diverge_sub", subscriber_conn_id=pair.sub_conn,
        worker_grace_period=10,
    )  # fmt: skip
    if int(pair.sub("SHOW server_version_num")[0][0]) < 180000:
        assert hook.subscription_errors("diverge_sub").conflicts is None
        assert check.execute(context())["problems"] == []
        return
    wait_until(lambda: (hook.subscription_errors("diverge_sub").conflicts or {}).get(
        "update_missing"), what="the conflict counted")  # fmt: skip
    ti = FakeTI()
    with pytest.raises(AirflowFailException, match="update_missing conflict") as failure:
        check.execute(context(ti))
    assert "diverged" in str(failure.value)
    assert "pg_stat_reset_subscription_stats" in str(failure.value)  # the counters only grow
    assert ti.pushed["return_value"]["pending_transaction"] is None  # nothing is stuck
    assert ti.pushed["return_value"]["conflicts"]["update_missing"] == 1
    tolerant = SubscriptionErrorCheckOperator(
        task_id="check", subscription="diverge_sub", subscriber_conn_id=pair.sub_conn,
        max_conflicts={"update_missing": 1}, worker_grace_period=10,
    )  # fmt: skip
    assert tolerant.execute(context())["problems"] == []
