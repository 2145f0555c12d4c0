"""The lake's coverage record: the newest record read back as written, local and on S3, and a
record made from an older one refused (two writers cannot both record)."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake import coverage
from airflow_pglogrepl.lake.coverage import Coverage, Gap
from airflow_pglogrepl.lake.lake import Lake


def test_the_newest_record_is_read_back_and_an_outdated_one_is_refused(lake_uri: str) -> None:
    lake = Lake(lake_uri, "slot_a")
    assert coverage.read(lake) is None
    first = Coverage({7: {"table": "public.a", "leaves": {"7": "public.a"}}})
    coverage.write(lake, first, None)
    assert first.version == 1
    second = coverage.read(lake)
    assert second == first
    assert second is not None
    second.gaps["8/3"] = Gap("public.b", "added", "b joined holding rows", "re-snapshot it", "0/1")
    coverage.write(lake, second, "0/1")
    assert coverage.read(lake) == second and second.version == 2
    stale = Coverage(first.relations, {}, 1)  # made from the first record
    with pytest.raises(LakeCommitConflictError):
        coverage.write(lake, stale, "0/2")
    assert coverage.read(lake) == second
    assert coverage.read(Lake(lake_uri, "slot_b")) is None  # each slot its own record
