"""The record of what each table was at the last look (``lake.seen_versions``): an entry holds
only while its table has no commit after the noted version (whatever wrote it, and after a log
cleanup past it); a record of another app, or torn, is no record; on an object store a table
that did not move costs two HEAD requests, not a read of its log."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.seen_versions import RECORD, SeenVersions, commit_file
from airflow_pglogrepl.testing.s3 import S3Server

APP = "airflow-pglogrepl-seen"


def commit(uri: str, lsn: int) -> None:
    """A version of the table at ``uri`` with the app transaction ``lsn`` (any writer's)."""
    write_deltalake(uri, pa.table({"id": [lsn]}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(APP, lsn)]),
                    storage_options=storage.delta_options(uri))  # fmt: skip


def test_a_noted_table_is_read_again_once_it_moves(lake_uri: str) -> None:
    state = f"{lake_uri}/state/public.a"
    commit(state, 10)
    commit(state, 20)
    seen = SeenVersions(lake_uri, APP)
    assert seen.lsn("state/public.a") == 20
    seen.save()

    again = SeenVersions(lake_uri, APP)  # a later run
    assert again.entry("state/public.a") == {"version": 1, "lsn": 20}
    assert again.tables("state") == ["public.a"]
    commit(state, 30)  # a writer that knows nothing of the record
    later = SeenVersions(lake_uri, APP)
    assert later.entry("state/public.a") is None
    assert later.lsn("state/public.a") == 30


def test_a_log_cleaned_past_the_noted_version_is_read_again(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    state = f"{root}/state/public.a"
    for lsn in (10, 20):
        commit(state, lsn)
    seen = SeenVersions(root, APP)
    seen.note("state/public.a", 0, lsn=10)  # as if noted when the table was at version 0
    seen.save()
    assert not SeenVersions(root, APP).still(["state/public.a"])["state/public.a"]
    os.remove(commit_file(state, 0))  # log cleanup took version 0 (and version 1 is there)
    os.remove(commit_file(state, 1))  # ... and a cleanup past it: no commit file is left
    assert not SeenVersions(root, APP).still(["state/public.a"])["state/public.a"]


def test_facts_of_one_version_join_and_a_new_version_replaces_them(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    commit(f"{root}/changes/public.a", 10)
    seen = SeenVersions(root, APP)
    seen.note("changes/public.a", 0, lsn=10)
    seen.note("changes/public.a", 0, upkeep_at=1.0)
    assert seen.noted("changes/public.a") == {"version": 0, "lsn": 10, "upkeep_at": 1.0}
    seen.note("changes/public.a", 1, lsn=20)
    assert seen.noted("changes/public.a") == {"version": 1, "lsn": 20}


def test_a_record_of_another_app_or_torn_is_no_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = str(tmp_path / "lake")
    commit(f"{root}/state/public.a", 10)
    seen = SeenVersions(root, APP)
    seen.lsn("state/public.a")
    seen.save()
    assert SeenVersions(root, "airflow-pglogrepl-other").noted("state/public.a") is None
    with open(os.path.join(root, RECORD), "w") as record:
        record.write('{"app": "airflow-pglogrepl-seen", "tab')
    with caplog.at_level(logging.WARNING, "airflow_pglogrepl.lake"):
        assert SeenVersions(root, APP).noted("state/public.a") is None
    assert "every table's log is read" in caplog.text


@pytest.mark.s3
def test_an_unmoved_table_costs_two_heads_on_an_object_store(s3_server: S3Server) -> None:
    root = f"s3://{s3_server.new_bucket()}/lake"
    with storage.using(s3_server.store):
        for name in ("public.a", "public.b"):
            for lsn in range(10, 60, 10):
                commit(f"{root}/state/{name}", lsn)
        before = s3_server.requests.copy()
        seen = SeenVersions(root, APP)
        assert [seen.lsn(f"state/{n}") for n in ("public.a", "public.b")] == [50, 50]
        seen.save()
        first = s3_server.requests - before

        before = s3_server.requests.copy()
        again = SeenVersions(root, APP)
        assert again.tables("state") == ["public.a", "public.b"]
        assert [again.lsn(f"state/{n}") for n in ("public.a", "public.b")] == [50, 50]
        again.save()  # nothing new: not written
        second = s3_server.requests - before
    assert first["GET"] > 10  # each log read whole
    # the record (its HEAD and GET), one listing of state/, and per table a HEAD of its
    # version's commit file and one of the next
    assert second == {"GET": 1, "LIST": 1, "HEAD": 5}
