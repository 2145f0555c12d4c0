"""The record of what each table was at the last look (``lake.seen_versions``): an entry holds
only while its table has no commit after the noted version (whatever wrote it, and after a log
cleanup past it); a record of another app, or torn, is no record; on an object store a table
that did not move costs two HEAD requests, not a read of its log."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from unittest.mock import ANY

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.seen_versions import RECORD, SeenVersions
from airflow_pglogrepl.testing.s3 import S3Server

APP = "airflow-pglogrepl-seen"


def commit(uri: str, lsn: int) -> None:
    """A version of the table at ``uri`` with the app transaction ``lsn`` (any writer's)."""
    write_deltalake(uri, pa.table({"id": [lsn]}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(APP, lsn)]),
                    storage_options=storage.delta_options(uri))  # fmt: skip


def commit_file(table: str, version: int) -> str:
    return os.path.join(table, "_delta_log", f"{version:020d}.json")


def noted_lake(tmp_path: Path) -> str:
    """A lake whose record notes ``state/public.a`` (one version, LSN 10); its root."""
    root = str(tmp_path / "lake")
    commit(f"{root}/state/public.a", 10)
    seen = SeenVersions(root, APP)
    seen.lsn("state/public.a")
    seen.save()
    return root


def test_a_noted_table_is_read_again_once_it_moves(lake_uri: str) -> None:
    state = f"{lake_uri}/state/public.a"
    commit(state, 10)
    commit(state, 20)
    seen = SeenVersions(lake_uri, APP)
    assert seen.lsn("state/public.a") == 20
    seen.save()

    again = SeenVersions(lake_uri, APP)  # a later run
    assert again.entry("state/public.a") == {"version": 1, "lsn": 20, "commit": ANY}
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
    assert seen.noted("changes/public.a") == {"version": 0, "lsn": 10, "upkeep_at": 1.0,
                                              "commit": ANY}  # fmt: skip
    commit(f"{root}/changes/public.a", 20)
    seen.note("changes/public.a", 1, lsn=20)
    assert seen.noted("changes/public.a") == {"version": 1, "lsn": 20, "commit": ANY}
    seen.note("state/public.a", 0, lsn=5)  # no such table: not noted
    assert not seen.knows("state/public.a")


def test_a_record_of_another_app_or_torn_is_no_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = noted_lake(tmp_path)
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


def test_a_table_written_again_from_scratch_is_read_again(tmp_path: Path) -> None:
    """Removed and written again (a lake reset, ``changes/`` removed before a snapshot as the
    lake's error advises), a table reaches the noted version with other commits: the noted
    LSN would make a state that lacks changes look merged."""
    import shutil

    root = str(tmp_path / "lake")
    changes = f"{root}/changes/public.a"
    for lsn in (10, 20):
        commit(changes, lsn)
    seen = SeenVersions(root, APP)
    assert seen.lsn("changes/public.a") == 20
    seen.save()
    shutil.rmtree(changes)
    for lsn in (100, 120):
        commit(changes, lsn)
    assert SeenVersions(root, APP).lsn("changes/public.a") == 120


def test_a_table_whose_log_is_gone_is_forgotten(tmp_path: Path) -> None:
    import shutil

    root = noted_lake(tmp_path)
    shutil.rmtree(f"{root}/state/public.a/_delta_log")
    again = SeenVersions(root, APP)
    assert again.lsn("state/public.a") is None and not again.knows("state/public.a")


def test_a_store_that_fails_a_check_counts_as_a_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A throttled or refused HEAD must not fail the run: the log is read instead."""
    from airflow_pglogrepl.lake import seen_versions

    root = noted_lake(tmp_path)

    def refused(system: object, path: str) -> bool:
        raise OSError("AWS Error SLOW_DOWN during HeadObject operation")

    monkeypatch.setattr(seen_versions, "_exists", refused)
    again = SeenVersions(root, APP)
    assert again.still(["state/public.a"]) == {"state/public.a": False}
    assert again.lsn("state/public.a") == 10
