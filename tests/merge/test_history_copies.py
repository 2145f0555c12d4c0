"""The versions of a table under REPLICA IDENTITY FULL: copies, the oldest ended first."""

from __future__ import annotations

import random

import pytest

from airflow_pglogrepl.changelog.history_columns import (
    ENDED_BY,
    IS_CURRENT,
    VALID_FROM,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO,
    VALID_TO_LSN,
    VALID_TO_SEQ,
)
from tests.support.history_model import History, batches, change, model, ordered, random_changes


@pytest.mark.parametrize("seed", range(30))
def test_a_full_identity_history_is_a_multiset_of_versions(seed: int) -> None:
    rng = random.Random(seed)
    changes = random_changes(rng, keyed=False, full=True, transactions=40)
    history = History(keyed=False)
    for batch in batches(rng, changes):
        assert history.merge(batch, keys=[], full=True) == 0
    assert ordered(history.rows) == ordered(model(changes, keyed=False, full=True))


def test_a_begun_history_with_copies_ends_the_oldest_copy_first() -> None:
    start = [{"id": 1, "v": 1, "big": None, VALID_FROM_LSN: None, VALID_FROM_SEQ: i,
              VALID_FROM: None, VALID_TO_LSN: None, VALID_TO_SEQ: None, VALID_TO: None,
              IS_CURRENT: True, ENDED_BY: None} for i in range(2)]  # fmt: skip
    history = History(keyed=False)
    history.rows = [dict(r) for r in start]
    batch = [change("I", 0x10, 0, 1, 1), change("D", 0x20, 0, 1, 1), change("D", 0x30, 0, 1, 1)]
    history.merge(batch, keys=[], full=True)
    assert ordered(history.rows) == ordered(model(batch, keyed=False, full=True, start=start))
    assert [r[VALID_FROM_SEQ] for r in history.rows if r[IS_CURRENT]] == [0]
