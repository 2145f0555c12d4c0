"""Commit information read from a table's log, on a local lake and on the S3 API server."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from airflow_pglogrepl.lake.commit_infos import commit_info, newest_first
from airflow_pglogrepl.lake.layout import is_local, local_path
from airflow_pglogrepl.lake.storage import delta_options


def test_each_commit_says_what_its_writer_put_there_newest_first(lake_uri: str) -> None:
    """On S3 the server answers in this process: a reader that kept the interpreter's lock
    while waiting for it (``DeltaTable.history``) would wait out its retries here."""
    uri = f"{lake_uri}/history/public.t"
    rows = pa.table({"id": [1]})
    for index in range(3):
        write_deltalake(uri, rows, mode="append", storage_options=delta_options(uri),
                        commit_properties=CommitProperties(
                            custom_metadata={"pglogrepl.state_version": str(index)}))  # fmt: skip
    found = list(newest_first(uri, 2))
    assert [e["version"] for e in found] == [2, 1, 0]
    assert [e["pglogrepl.state_version"] for e in found] == ["2", "1", "0"]
    assert [e["version"] for e in newest_first(uri, 2, 1)] == [2, 1]
    assert commit_info(uri, 4) is None
    if is_local(uri):
        log = Path(local_path(uri)) / "_delta_log"
        # a commit without commitInfo (optional: another writer's) is walked past, not an end
        (log / f"{3:020d}.json").write_text('{"txn":{"appId":"other","version":1}}\n')
        assert [e["version"] for e in newest_first(uri, 3)] == [3, 2, 1, 0]
        assert commit_info(uri, 3) == {"version": 3}
        (log / f"{1:020d}.json").unlink()  # a commit file removed (log cleanup) ends it there
        assert [e["version"] for e in newest_first(uri, 3)] == [3, 2]
