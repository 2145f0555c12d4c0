"""The versions of a table under REPLICA IDENTITY FULL: copies, the oldest ended first."""

from __future__ import annotations

import random

import pyarrow as pa
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


@pytest.mark.parametrize(
    ("before", "after", "kind"),
    [
        (float("nan"), 1.0, pa.float64()),
        (["a"], ["b"], pa.list_(pa.string())),
        ({"months": 0, "days": 1}, {"months": 0, "days": 2},
         pa.struct([("months", pa.int32()), ("days", pa.int32())])),
    ],
)  # fmt: skip
def test_copies_of_any_value_are_matched_as_postgresql_compares_them(
    before: object, after: object, kind: pa.DataType
) -> None:
    """A NaN equals itself (PostgreSQL's floats and numerics say so), an array or an interval
    is a value like any other."""
    from airflow_pglogrepl.changelog.history_columns import history_schema
    from airflow_pglogrepl.merge.history_copies import copies_versions

    table = pa.schema([("x", kind)])
    changes = pa.schema(
        [
            *table,
            ("_op", pa.string()),
            ("_commit_lsn", pa.int64()),
            ("_seq", pa.int64()),
            ("_commit_ts", pa.timestamp("us", tz="UTC")),
            ("_unchanged", pa.list_(pa.string())),
            ("_old", pa.struct(table)),
        ]
    )
    batch = pa.Table.from_pylist([
        {"x": before, "_op": "I", "_commit_lsn": 16, "_seq": 0, "_unchanged": []},
        {"x": after, "_op": "U", "_commit_lsn": 32, "_seq": 0, "_unchanged": [],
         "_old": {"x": before}},
    ], schema=changes)  # fmt: skip
    types = history_schema(table)
    made = copies_versions(batch, ["x"], lambda _: types.empty_table(), types)
    assert made.orphans == 0
    assert [(r[IS_CURRENT], r[ENDED_BY]) for r in made.opened.to_pylist()] == [
        (False, "update"),
        (True, None),
    ]
