"""Helpers for upkeep tests: a lake written the way the drain writes it, and a log aged as if
the lake had run for hours."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from airflow_pglogrepl.lake import delta, storage
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import LakePaths, app_id, is_local
from airflow_pglogrepl.lsn import LSN
from tests.support.s3 import backdate

SLOT = "slot_u"
APP = app_id(SLOT)


class Built:
    """A lake of ``slot`` written the way the drain writes it: changes, then the windows row,
    then state."""

    def __init__(self, root: Path | str, slot: str = SLOT) -> None:
        self.root = str(root)
        self.paths = LakePaths(self.root)
        self.app = app_id(slot)
        self.lake = Lake(self.root, slot)
        self.start = 0

    def window(self, end: int, rows: dict[str, list[int]]) -> None:
        for table, ids in rows.items():
            lsns = pa.array([end - 1] * len(ids), pa.int64())
            batch = pa.table({"id": pa.array(ids, pa.int64()), "_commit_lsn": lsns})
            uri = self.paths.changes(table)
            written = delta.write_file(uri, batch, prefix=f"{end:016X}")
            delta.commit_files(uri, batch.schema, [written], app=self.app, version=end,
                               expected=delta.txn_version(uri, self.app))  # fmt: skip
        self.lake.record(kind="window", start=LSN(self.start), end=LSN(end))
        self.start = end

    def state(self, table: str, at: int, ids: list[int], **config: str) -> None:
        """The whole state at ``at`` as one version (an overwrite: the old files are removed)."""
        rows = pa.table({"id": pa.array(sorted(ids), pa.int64())})
        commit = CommitProperties(app_transactions=[Transaction(self.app, at)])
        uri = self.paths.state(table)
        write_deltalake(uri, rows, mode="overwrite", configuration=config or None,
                        commit_properties=commit,
                        storage_options=storage.delta_options(uri))  # fmt: skip


def versions(uri: str) -> int:
    table = delta.open_table(uri)
    assert table is not None
    return int(table.version())


def files(uri: str) -> int:
    table = delta.open_table(uri)
    assert table is not None
    return len(table.file_uris())


def ids(uri: str, version: int | None = None) -> list[int]:
    return sorted(delta.read_table(uri, version).column("id").to_pylist())


def log_names(uri: str) -> list[str]:
    from pyarrow import fs

    system, base = storage.filesystem(uri)
    found = system.get_file_info(fs.FileSelector(f"{base}/_delta_log"))
    return sorted(info.base_name for info in found)


def age(uri: str, hours: dict[int, float]) -> None:
    """Move versions of a table back in time: ``hours[v]`` for version ``v`` (the times its log
    entry records; a local entry's modification time too, which an object's cannot be)."""
    system, base = storage.filesystem(uri)
    now = time.time()
    for version, back in hours.items():
        path = f"{base}/_delta_log/{version:020d}.json"
        shift = int(back * 3600 * 1000)
        with system.open_input_stream(path) as stream:
            text = stream.read().decode()
        actions = [json.loads(line) for line in text.splitlines() if line]
        for action in actions:
            for kind, key in (("commitInfo", "timestamp"), ("remove", "deletionTimestamp"),
                              ("add", "modificationTime")):  # fmt: skip
                if kind in action and action[kind].get(key) is not None:
                    action[kind][key] -= shift
        with system.open_output_stream(path) as stream:
            stream.write("".join(json.dumps(a) + "\n" for a in actions).encode())
        if is_local(uri):
            os.utime(path, (now - back * 3600, now - back * 3600))
        else:
            backdate(f"{uri}/_delta_log/{version:020d}.json", now - back * 3600)
