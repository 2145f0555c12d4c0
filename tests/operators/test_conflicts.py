"""Cutover toolkit decisions without a server: fence state, sequence plans, parity, conflicts."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from airflow_pglogrepl.exceptions import InvalidLSNError
from airflow_pglogrepl.hooks.conflicts import SubscriptionErrors
from airflow_pglogrepl.hooks.fence import FenceGrant, RoleFence, parse_role_settings
from airflow_pglogrepl.hooks.parity import TableChecksum
from airflow_pglogrepl.hooks.records import RelState
from airflow_pglogrepl.hooks.sequences import SequenceState
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.operators.arguments import names
from airflow_pglogrepl.operators.conflicts import (
    SkipConflictingTransactionOperator,
    describe_pending,
    parse_skip_lsn,
    subscription_problems,
)
from airflow_pglogrepl.operators.fence import WriteFenceOperator
from airflow_pglogrepl.operators.parity import compare
from airflow_pglogrepl.operators.sequences import SyncSequencesOperator, plan_sequence
from airflow_pglogrepl.pgoutput.messages import (
    BeginMessage,
    CommitMessage,
    DeleteMessage,
    InsertMessage,
    TruncateMessage,
    UpdateMessage,
)
from airflow_pglogrepl.pgoutput.pending import PendingTransaction, first_pending_transaction
from airflow_pglogrepl.tables import TableRef
from tests.support.pgoutput_encoder import T0, encode, relation

HOSTILE = TableRef('Sales "Q1"', "Ordërs; drop")

# -- fence state -----------------------------------------------------------------------------------


def test_role_fence_round_trips_hostile_names_through_its_setting_text() -> None:
    state = RoleFence(
        role='app "x"; y',
        read_only_set=True,
        previous_read_only="off",
        grants=(FenceGrant(HOSTILE, "INSERT", True), FenceGrant(TableRef("public", "t"), "DELETE")),
    )
    text = state.to_json()
    assert "\n" not in text and "=" not in text.split(":", 1)[0]
    back = RoleFence.from_json(state.role, text)
    assert back.read_only_set and back.previous_read_only == "off"
    assert sorted(back.grants) == sorted(state.grants)
    # The catalog stores it as one ``name=value`` item; splitting at the first '=' recovers it.
    settings = parse_role_settings([f"pglogrepl.fence_state={text}", "search_path=a, b"])
    assert RoleFence.from_json(state.role, settings["pglogrepl.fence_state"]) == back
    assert settings["search_path"] == "a, b"


def test_role_fence_grows_and_never_forgets() -> None:
    first = RoleFence("app").with_grants([FenceGrant(HOSTILE, "INSERT", True)])
    # A repeat run finds the privilege gone already: it must keep what the first run saved.
    again = first.with_grants([FenceGrant(HOSTILE, "INSERT", False), FenceGrant(HOSTILE, "UPDATE")])
    assert again.grants == (FenceGrant(HOSTILE, "INSERT", True), FenceGrant(HOSTILE, "UPDATE"))
    assert first.with_grants([]) == first


def test_role_fence_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match=r"unknown pglogrepl\.fence_state format"):
        RoleFence.from_json("app", '{"v": 2, "grants": []}')
    assert parse_role_settings(None) == {}


def test_fence_operator_validates_its_arguments() -> None:
    base: dict[str, Any] = {"task_id": "f", "postgres_conn_id": "pub"}
    with pytest.raises(ValueError, match="at least one role"):
        WriteFenceOperator(**base, roles=[], tables=["t"])
    with pytest.raises(ValueError, match="tables, a publication"):
        WriteFenceOperator(**base, roles=["app"])
    with pytest.raises(ValueError, match="revoke_privileges, read_only"):
        WriteFenceOperator(**base, roles=["app"], tables=["t"], revoke_privileges=False)
    with pytest.raises(ValueError, match="terminate must be"):
        WriteFenceOperator(**base, roles=["app"], tables=["t"], terminate="all")  # type: ignore[arg-type]
    op = WriteFenceOperator(**base, roles="app", publication="{{ params.pub }}")
    assert "publication" in op.template_fields and names(op.roles) == ["app"]
    assert names(None) == [] and names(("a", "b")) == ["a", "b"]


# -- sequences -------------------------------------------------------------------------------------


def _seq(last: int | None, increment: int = 1, max_value: int = 2**63 - 1) -> SequenceState:
    return SequenceState(TableRef("public", "s"), last, increment, 1, max_value)


@pytest.mark.parametrize(
    ("current", "publisher", "column", "margin", "expected"),
    [
        (None, 50, 55, 0, 55),  # the subscriber's rows go further than the publisher's sequence
        (None, 40, 30, 100, 140),  # values taken on the publisher and not (yet) in rows
        (1, None, 12, 0, 12),  # the publisher sequence is unreadable: the column decides
        (200, 40, 30, 0, None),  # never backwards
        (140, 40, 30, 100, None),  # already there: nothing to do
        (None, None, None, 10, None),  # nothing used anywhere
    ],
)
def test_plan_sequence(
    current: int | None,
    publisher: int | None,
    column: int | None,
    margin: int,
    expected: int | None,
) -> None:
    plan = plan_sequence(_seq(current), publisher_last=publisher, column_max=column, margin=margin)
    assert plan.new_value == expected and not plan.error


def test_plan_sequence_refuses_what_it_cannot_do() -> None:
    descending = plan_sequence(_seq(None, increment=-1), publisher_last=5, column_max=5, margin=0)
    assert descending.new_value is None and "descending" in descending.reason
    overflow = plan_sequence(_seq(None, max_value=100), publisher_last=99, column_max=None,
                             margin=5)  # fmt: skip
    assert overflow.error and "max_value 100" in overflow.reason


def test_sync_sequences_needs_something_to_sync() -> None:
    with pytest.raises(ValueError, match="tables, a publication or sequences"):
        SyncSequencesOperator(task_id="s", publisher_conn_id="p", subscriber_conn_id="s")
    with pytest.raises(ValueError, match="margin"):
        SyncSequencesOperator(
            task_id="s", publisher_conn_id="p", subscriber_conn_id="s", tables=["t"], margin=-1
        )


# -- parity ----------------------------------------------------------------------------------------


def test_parity_compare_says_by_how_much() -> None:
    t = TableRef("public", "orders")
    same = compare(t, TableChecksum(10, -5), TableChecksum(10, -5))
    assert same.problem is None and same.to_dict()["match"] is True
    fewer = compare(t, TableChecksum(10, 1), TableChecksum(9, 2))
    assert fewer.problem == "subscriber has 1 row fewer (9 vs 10 on the publisher)"
    assert fewer.to_dict()["row_difference"] == -1
    more = compare(t, TableChecksum(10, 1), TableChecksum(13, 2))
    assert more.problem is not None and more.problem.startswith("subscriber has 3 rows more")
    content = compare(t, TableChecksum(10, 2**62), TableChecksum(10, 2**62 + 1))
    assert content.problem is not None and "checksums differ" in content.problem
    assert content.to_dict()["publisher_checksum"] == str(2**62)  # exact in JSON
    assert compare(t, TableChecksum(1, 1), None).problem == "missing on the subscriber"


# -- conflicts -------------------------------------------------------------------------------------


def _pgoutput(*messages: Any) -> list[bytes]:
    return [encode(m) for m in messages]


def _txn(xid: int, final: int, end: int, *body: Any) -> list[Any]:
    return [BeginMessage(LSN(final), T0, xid), *body, CommitMessage(0, LSN(final), LSN(end), T0)]


def test_first_pending_transaction_passes_over_applied_ones() -> None:
    orders = relation(16400, "orders", [("id", 23, True)])
    other = relation(16401, HOSTILE.name, [("id", 23, True)], namespace=HOSTILE.schema)
    rows = _pgoutput(
        *_txn(700, 0x1000, 0x1040, orders, InsertMessage(None, 16400, (b"1",))),
        *_txn(
            701, 0x2000, 0x2040, other,
            InsertMessage(None, 16401, (b"1",)), InsertMessage(None, 16401, (b"2",)),
            UpdateMessage(None, 16400, None, None, (b"1",)),
            DeleteMessage(None, 16400, "K", (b"1",)), TruncateMessage(None, 0, (16401,)),
        ),
    )  # fmt: skip
    pending = first_pending_transaction(rows, applied_upto=LSN(0x1040))
    assert pending is not None and pending.complete
    assert (pending.xid, pending.finish_lsn) == (701, LSN(0x2000))
    assert pending.changes == (
        (HOSTILE, "insert", 2), (TableRef("public", "orders"), "update", 1),
        (TableRef("public", "orders"), "delete", 1), (HOSTILE, "truncate", 1),
    )  # fmt: skip
    assert pending.tables == (HOSTILE, TableRef("public", "orders"))
    first = first_pending_transaction(rows, applied_upto=None)
    assert first is not None and first.xid == 700
    assert first_pending_transaction(rows, applied_upto=LSN(0x2040)) is None


def test_first_pending_transaction_read_in_part() -> None:
    rows = _pgoutput(BeginMessage(LSN(0x3000), T0, 9), relation(1, "t", [("id", 23)]),
                     InsertMessage(None, 1, (b"1",)))  # fmt: skip
    pending = first_pending_transaction(rows, applied_upto=LSN(0x2000))
    assert pending is not None and not pending.complete
    text = describe_pending(pending)
    assert "finish LSN 0/3000, read in part" in text and "public.t (1 insert)" in text


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


def test_pending_transaction_record() -> None:
    pending = PendingTransaction(5, LSN("0/10"), T0, ((HOSTILE, "insert", 1),), complete=True)
    data = pending.to_dict()
    assert data["finish_lsn"] == "0/10" and data["tables"] == [str(HOSTILE)]
    assert data["changes"] == [{"table": str(HOSTILE), "kind": "insert", "count": 1}]
