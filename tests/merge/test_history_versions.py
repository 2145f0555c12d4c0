"""The reduction of a keyed table's changes to versions, against a sequential model."""

from __future__ import annotations

import random

import pytest

from airflow_pglogrepl.changelog.history_columns import (
    ENDED_BY,
    IS_CURRENT,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO_LSN,
    VALID_TO_SEQ,
)
from airflow_pglogrepl.merge.history_versions import MissingVersionError
from tests.support.history_model import History, batches, change, model, ordered, random_changes


@pytest.mark.parametrize("seed", range(40))
def test_a_keyed_history_over_random_batches_is_the_sequential_models(seed: int) -> None:
    rng = random.Random(seed)
    changes = random_changes(rng, keyed=True, full=False, transactions=40)
    history = History(keyed=True)
    for batch in batches(rng, changes):
        assert history.merge(batch, keys=["id"]) == 0
    assert ordered(history.rows) == ordered(model(changes, keyed=True, full=False))


def test_a_table_without_identity_has_a_version_per_insert_ended_by_truncate() -> None:
    changes = [change("I", 0x10, 0, 1, 1), change("I", 0x10, 1, 1, 1), change("I", 0x18, 0, 1, 1),
               change("T", 0x20, 0), change("I", 0x30, 0, 2, 2)]  # fmt: skip
    history = History(keyed=False)
    history.merge(changes[:2], keys=[])  # two equal rows, each a version of its own
    history.merge(changes[2:], keys=[])
    ends = sorted((r[VALID_FROM_SEQ], r[VALID_FROM_LSN], r[VALID_TO_LSN], r[ENDED_BY])
                  for r in history.rows)  # fmt: skip
    assert ends == [(0, 0x10, 0x20, "truncate"), (0, 0x18, 0x20, "truncate"),
                    (0, 0x30, None, None), (1, 0x10, 0x20, "truncate")]  # fmt: skip


def test_changes_to_one_row_in_one_transaction_are_versions_never_visible() -> None:
    history = History(keyed=True)
    history.merge([change("I", 0x10, 0, 1, 1, "t"), change("U", 0x10, 1, 1, 2, unchanged=("big",)),
                   change("U", 0x10, 2, 1, 3, unchanged=("big",))], keys=["id"])  # fmt: skip
    rows = sorted(history.rows, key=lambda r: r[VALID_FROM_SEQ])
    assert [(r["v"], r["big"], r[VALID_FROM_SEQ], r[VALID_TO_SEQ], r[ENDED_BY]) for r in rows] == [
        (1, "t", 0, 1, "update"),
        (2, "t", 1, 2, "update"),
        (3, "t", 2, None, None),
    ]
    assert all(r[VALID_FROM_LSN] == 0x10 for r in rows)


def test_an_unchanged_toast_value_comes_from_the_current_version_of_an_earlier_batch() -> None:
    history = History(keyed=True)
    history.merge([change("I", 0x10, 0, 1, 1, "toasted")], keys=["id"])
    history.merge([change("U", 0x20, 0, 2, 5, unchanged=("big",),
                          old={"id": 1, "v": None, "big": None})], keys=["id"])  # fmt: skip
    now = [r for r in history.rows if r[IS_CURRENT]]
    assert [(r["id"], r["v"], r["big"]) for r in now] == [(2, 5, "toasted")]
    assert [r[ENDED_BY] for r in history.rows if not r[IS_CURRENT]] == ["key_change"]


def test_an_unchanged_toast_value_of_a_row_nowhere_is_refused() -> None:
    history = History(keyed=True)
    with pytest.raises(MissingVersionError, match="'id': 7"):
        history.merge([change("U", 0x20, 0, 7, 5, unchanged=("big",))], keys=["id"])
    assert history.rows == []


def test_a_change_ending_a_version_the_history_lacks_ends_nothing() -> None:
    history = History(keyed=True)
    # a delete of a row never seen (ended in the MERGE, where it matches nothing), and an
    # update of a row the batch's own TRUNCATE ended: counted
    assert history.merge([change("D", 0x20, 0, 7), change("I", 0x30, 0, 8, 1, "b"),
                          change("T", 0x40, 0), change("U", 0x50, 0, 8, 2, "c")],
                         keys=["id"]) == 1  # fmt: skip
    assert sorted((r["id"], r["v"], r[IS_CURRENT]) for r in history.rows) == [
        (8, 1, False),
        (8, 2, True),
    ]


def test_a_truncate_ends_the_versions_of_earlier_batches_and_of_its_own() -> None:
    history = History(keyed=True)
    history.merge([change("I", 0x10, 0, 1, 1), change("I", 0x10, 1, 2, 2)], keys=["id"])
    history.merge([change("U", 0x20, 0, 1, 9), change("I", 0x20, 1, 3, 3), change("T", 0x30, 0),
                   change("I", 0x40, 0, 1, 4)], keys=["id"])  # fmt: skip
    ends = sorted((r["id"], r["v"], r[ENDED_BY] or "") for r in history.rows)
    assert ends == [(1, 1, "update"), (1, 4, ""), (1, 9, "truncate"), (2, 2, "truncate"),
                    (3, 3, "truncate")]  # fmt: skip
