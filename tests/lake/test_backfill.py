"""The lake's record of its backfills: read back as written, local and on S3, a record made
from an older one refused, and the chunks counted from the rows table's app transaction."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake import backfill, delta
from airflow_pglogrepl.lake.backfill import Backfills, Plan
from airflow_pglogrepl.lake.lake import Lake

PLAN = Plan(table='public."odd, name"', relid=16384, why="added", low="0/16B3748",
            in_progress=(731, 4294967295), files=(16390,), columns=("id", "v"), step=40,
            began="2026-12-02T13:00:00+00:00")  # fmt: skip


def test_the_newest_record_is_read_back_and_an_outdated_one_is_refused(lake_uri: str) -> None:
    lake = Lake(lake_uri, "slot_a")
    assert backfill.read(lake) == Backfills()
    first = Backfills({PLAN.table: PLAN})
    backfill.write(lake, first)
    assert first.version == 1
    again = backfill.read(lake)
    assert again == first
    del again.plans[PLAN.table]
    backfill.write(lake, again)
    assert backfill.read(lake) == Backfills({}, 2)
    with pytest.raises(LakeCommitConflictError):
        backfill.write(lake, Backfills({PLAN.table: PLAN}, 1))  # made from the first record
    assert backfill.read(Lake(lake_uri, "slot_b")) == Backfills()  # each slot its own


def test_chunks_are_counted_by_the_rows_tables_app_transaction(lake_uri: str) -> None:
    lake = Lake(lake_uri, "slot_a")
    uri = backfill.rows_uri(lake, PLAN)
    assert uri.endswith("/_pglogrepl/backfill/public.%22odd%2C%20name%22-00000000016B3748") or (
        "/_pglogrepl/backfill/" in uri and uri.endswith("-00000000016B3748")
    )
    assert backfill.chunks_done(lake, PLAN) == 0
    rows = pa.table({"id": [1, 2]})
    for chunk in (1, 2):
        written = delta.write_file(uri, rows, prefix=f"chunk-{chunk}")
        delta.commit_files(uri, rows.schema, [written], app=lake.app, version=chunk,
                           expected=chunk - 1 or None)  # fmt: skip
    assert backfill.chunks_done(lake, PLAN) == 2
    later = Plan(**{**PLAN.to_dict(), "low": "0/16B3750", "in_progress": (), "files": (1,),
                    "columns": ("id",)})  # fmt: skip
    assert backfill.chunks_done(lake, later) == 0  # begun again: chunks of its own
