"""A Delta table's commit information (``commitInfo``), read from the commit files of its log.

Why not ``DeltaTable.history``: deltalake 1.6 holds Python's global interpreter lock while it
lists and reads the log, so against an S3 API server running in the same process (the testing
API's, ``testing.s3``) the request it waits for is never answered, and it retries for minutes.
Here each commit file is one GET through pyarrow's filesystem, which lets other threads run;
only the versions asked for are read, newest first, with no listing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from airflow_pglogrepl.lake.storage import filesystem


def commit_info(uri: str, version: int) -> dict[str, Any] | None:
    """The ``commitInfo`` of ``version`` of the table at ``uri`` (the lake's own name of it,
    not percent-encoded), with its ``version``; ``{"version": version}`` for a commit that has
    none (the action is optional: another writer may leave it out); None when that commit file
    is not there (never written, or removed by log cleanup)."""
    system, base = filesystem(uri)
    try:
        with system.open_input_stream(f"{base}/_delta_log/{version:020d}.json") as stream:
            text = stream.read().decode()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if '"commitInfo"' not in line:
            continue
        action = json.loads(line)
        if isinstance(action, dict) and isinstance(action.get("commitInfo"), dict):
            return {**action["commitInfo"], "version": version}
    return {"version": version}


def newest_first(uri: str, newest: int, oldest: int = 0) -> Iterator[dict[str, Any]]:
    """The commit information of versions ``newest`` down to ``oldest``, as long as their
    commit files are there (a version whose file is gone ends the walk)."""
    for version in range(newest, oldest - 1, -1):
        found = commit_info(uri, version)
        if found is None:
            return
        yield found
