"""A slot's versioned record: the newest version read back with its row, each slot its own,
and a row made from an older version refused (two writers cannot both record)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.slot_records import read_newest, record_schema, write_next

SCHEMA = record_schema(("recorded_at", pa.timestamp("us", tz="UTC")), ("note", pa.string()))


def test_versions_go_forward_from_the_newest_only(lake_uri: str) -> None:
    lake, uri = Lake(lake_uri, "slot_a"), f"{lake_uri}/_pglogrepl/notes"
    assert read_newest(lake, uri) is None
    assert write_next(lake, uri, SCHEMA, {"note": "one"}, made_from=0, name="notes") == 1
    assert write_next(lake, uri, SCHEMA, {"note": "two"}, made_from=1, name="notes") == 2
    newest = read_newest(lake, uri)
    assert newest is not None and newest[0] == 2
    assert newest[1] is not None and newest[1]["note"] == "two"
    assert newest[1]["recorded_at"] is not None and newest[1]["slot"] == "slot_a"
    with pytest.raises(LakeCommitConflictError):
        write_next(lake, uri, SCHEMA, {"note": "stale"}, made_from=1, name="notes")
    assert read_newest(Lake(lake_uri, "slot_b"), uri) is None
    assert write_next(Lake(lake_uri, "slot_b"), uri, SCHEMA, {"note": "b"}, made_from=0,
                      name="notes") == 1  # fmt: skip
    newest = read_newest(lake, uri)
    assert newest is not None and newest[1] is not None and newest[1]["note"] == "two"
