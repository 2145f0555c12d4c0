"""The rows of ``_pglogrepl/windows`` and what they say of the lake's owner: the newest claim,
else, for a lake from before claims, what its windows say."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.windows_table import (
    CLAIM_KEY,
    claim_row,
    identity_of,
    window_row,
    windows_schema,
)
from airflow_pglogrepl.lsn import LSN

SOURCE = {"system_identifier": "7", "timeline": 1, "database": "db", "database_oid": 5}


def test_a_lake_from_before_claims_that_two_slots_wrote_stays_its_writers(tmp_path: Path) -> None:
    """Review finding: such a lake was refused to every slot, its owner included."""
    from airflow_pglogrepl.exceptions import LakeOfAnotherSlotError

    root = str(tmp_path / "lake")
    for slot, end in (("old", 0x200), ("new", 0x300)):
        writer = Lake(root, slot)
        writer.source = SOURCE
        writer.record(kind="window", start=LSN(end - 0x100), end=LSN(end))
    assert Lake(root, "old").claim(SOURCE, publications=["p"], began_with="drain")["slot"] == "old"
    with pytest.raises(LakeOfAnotherSlotError):  # the first to claim it keeps it
        Lake(root, "new").claim(SOURCE, publications=["p"], began_with="drain")


def test_the_newest_claim_is_the_owner_whatever_the_order_of_the_rows() -> None:
    """Claims carry versions 1, 2, ... of their app: the highest wins, not the last row read
    (a compacted table's rows come in any order), and its version is not part of the identity."""
    older = claim_row("a", {"slot": "a", "database": "db"}, 1)
    newer = claim_row("b", {"slot": "b", "database": "db"}, 2)
    window = window_row(kind="window", slot="a", start=LSN(0x100), end=LSN(0x200),
                        transactions=1, changes=1, tables={"public.t": 1},
                        source=SOURCE)  # fmt: skip
    for rows in ([older, newer, window], [window, newer, older]):
        assert identity_of(rows, "a") == {"slot": "b", "database": "db"}
    assert set(older) == set(window) == set(windows_schema().names)
    assert CLAIM_KEY not in (identity_of([older], "a") or {})


def test_a_lake_nothing_committed_to_belongs_to_nobody() -> None:
    assert identity_of([], "a") is None
    first = window_row(kind="snapshot", slot="a", start=LSN(0x100), end=LSN(0x200),
                       transactions=0, changes=0, tables=None, source=None)  # fmt: skip
    owner = identity_of([first], "b")
    assert owner is not None and owner["slot"] == "a" and owner["began_with"] == "snapshot"
