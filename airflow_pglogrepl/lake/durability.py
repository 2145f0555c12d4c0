"""Why a commit the lake made outlives a power cut, and never overwrites another writer's.

Local lakes are made durable before a commit returns: delta-rs does not fsync, and the slot may
be advanced as soon as the commit is known, so the data files, the log entry and their
directories are fsynced here (a power cut must not take back what the slot forgot). On an
object store a PUT that returned is durable (``lake.storage``): nothing is added there.

The log entries delta-rs cannot write (a table created with column mapping, a column renamed
or added under it, a snapshot's publish) the lake writes whole (``put_commit``): complete or
not at all, as durable as the rest, and only where no entry is, so that a writer that stalled
after it chose a version cannot overwrite what another committed.
"""

from __future__ import annotations

import contextlib
import os
import uuid

from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lake.storage import filesystem


def make_log_durable(uri: str, *, after: int | None = None) -> None:
    """fsync a local table's log entries newer than version ``after`` (None: all of them, a
    new table), its log directory, its directory and, for a new table, the directories that
    gained it (``changes/``, ``state/`` or ``_pglogrepl/``, the lake root, and the root's
    parent, for a lake that is new)."""
    log_dir = os.path.join(uri, "_delta_log")
    for entry in os.listdir(log_dir):
        stem, _, ext = entry.partition(".")
        if ext == "json" and stem.isdigit() and (after is None or int(stem) > after):
            fsync(os.path.join(log_dir, entry))
    fsync(log_dir)
    fsync(uri)
    if after is None:  # the table's directory is new, and maybe its parents up to the root's
        parent = os.path.abspath(uri)
        for _ in range(3):
            parent = os.path.dirname(parent)
            fsync(parent)


def fsync(path: str) -> None:
    """Make a local file's content, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FIRST_COMMIT = f"{0:020d}.json"


def put_first_commit(table_uri: str, data: bytes) -> bool:
    """Write the table's ``_delta_log/00000000000000000000.json`` whole, only if it does not
    exist; False (nothing written) when it does (``put_commit`` of version 0)."""
    return put_commit(table_uri, 0, data)


def put_commit(table_uri: str, version: int, data: bytes) -> bool:
    """Write the table's log entry of ``version`` whole, only if it does not exist; False
    (nothing written) when it does: another writer committed that version first.

    Locally a complete, fsynced temporary file is hard-linked to its name, which fails if the
    name exists. On an object store one create-only PUT (``If-None-Match: *``, as delta-rs's
    own commits; ``lake.create_only``), which the store refuses where the entry exists: a
    writer that stalled after it chose ``version`` cannot overwrite what another committed.
    For the commits delta-rs cannot make: a table created with column mapping, a column
    renamed or added under it, a snapshot's publish."""
    from airflow_pglogrepl.lake.create_only import put_if_absent

    entry = f"{version:020d}.json"
    if not is_local(table_uri):
        return put_if_absent(f"{storage.canonical(table_uri)}/_delta_log/{entry}", data)
    _, base = filesystem(table_uri)
    directory = f"{base}/_delta_log"
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{entry}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, os.path.join(directory, entry))
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    for path in (directory, base, os.path.dirname(base)):
        fsync(path)  # the new entry, the table's directory, and the parent that lists it
    return True
