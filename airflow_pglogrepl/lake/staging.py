"""A table's state staged out of readers' sight, then published whole: the initial snapshot.

Spark writes each table's copy as a Delta table of its own in a sub-directory of the table's
final place, ``state/<table>/snapshot-<consistent point, 16 hex digits>/``. Nothing is at
``state/<table>/_delta_log`` yet, and a directory without a log is no table to any Delta reader
(Spark, delta-rs, ``delta.list_tables``): a snapshot killed while it copies leaves nothing that
can be taken for state, only a staged directory, whose name says which consistent point it was.

``publish`` then makes the staged table the final one: it writes ``state/<table>/_delta_log/
00000000000000000000.json``, which is the staged table's own version 0 (Spark's protocol,
metadata with ``pglogrepl.key``, deletion vectors enabled, the app transaction, the file
statistics) with each added file's path moved under the staged directory, and only then removes
the staged log (never the data files). Why this is safe:

- the final log entry appears whole and only if none was there (put-if-absent): locally a
  complete, fsynced temporary file is hard-linked to its name, which fails if the name exists;
  on an object store the object is written only when absent and becomes visible whole when its
  upload completes, the single-writer assumption of Delta's own S3 log store, which the lake's
  writer lock (``hooks.locks``) makes true. A filesystem that shows a file while it is written
  (HDFS) would need the temporary-name-and-rename route, which is not done here;
- relative paths inside the table's directory are what Delta's log holds for partitioned tables
  (``col=value/part-...``): every reader resolves them against the table root, so the lake
  still moves as a whole (no absolute path anywhere);
- Spark's own commit is republished rather than a new one built (``deltalake``'s
  ``create_table_with_add_actions`` would add a ``variantType`` reader feature no column needs,
  which readers without it refuse): protocol and schema are exactly what an overwrite by Spark
  would have produced, and merges (Spark's and delta-rs's) read it and write deletion vectors;
- a staged commit that is not a plain first write (a later version, a removed file, a deletion
  vector, whose path Delta derives from the table root) is refused rather than moved;
- ``VACUUM`` (Spark's and delta-rs's) lists the table's files recursively, skipping only
  directories whose names start with ``_`` or ``.``: ``snapshot-*`` files are removed once no
  retained version names them, like any other data file (checked with Spark 4.2 and Delta 4.4:
  an overwrite and ``VACUUM ... RETAIN 0 HOURS`` leave the directory empty).

The tables are published one after the other, then the lake records the snapshot, so a kill
between two publishes still leaves published tables without a committed snapshot: the window
is a few metadata writes per table instead of the whole copy, and what it leaves carries the
app transaction at the consistent point, so ``leftovers`` finds it for the next snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import LakeError, SnapshotTableExistsError
from airflow_pglogrepl.lake import delta, durability, mapping, opened_tables, storage
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lsn import LSN

if TYPE_CHECKING:
    from collections.abc import Iterator

STAGED_PREFIX = "snapshot-"
LOG_DIR = "_delta_log"
FIRST_COMMIT = durability.FIRST_COMMIT
_STAGED = re.compile(r"snapshot-([0-9A-F]{16})")
_VERSION = re.compile(r"\d{20}\.json")


def staged_uri(table_uri: str, at: LSN) -> str:
    """Where the copy of the table at ``table_uri`` taken at ``at`` is staged."""
    return f"{table_uri}/{STAGED_PREFIX}{int(at):016X}"


def staged_point(name: str) -> LSN | None:
    """The consistent point a staged directory's name carries (None: not a staged directory)."""
    match = _STAGED.fullmatch(name)
    return LSN(int(match.group(1), 16)) if match else None


def staged_points(parent: str) -> list[LSN]:
    """Consistent points of every copy staged under the tables in ``parent`` (``state/``),
    sorted, each once: the snapshots killed runs began there."""
    points = {
        point
        for table in _directories(parent)
        for name in _directories(f"{parent}/{table}")
        if (point := staged_point(name)) is not None
    }
    return sorted(points)


def leftovers(parent: str, app: str) -> list[str]:
    """What killed initial snapshots left in ``parent`` (``state/``), to remove before the next.

    Only for a lake without a committed position (the caller checks): there, a table carrying
    ``app``'s transaction is one a killed publish made, and a staged directory in a folder
    with no table is named by no log. A table of another writer is left alone, and so is every
    staged directory inside a table, whose files that table's log may name.
    """
    found = []
    for table in _directories(parent):
        uri = f"{parent}/{table}"
        opened = delta.open_table(uri)
        if opened is not None:
            if opened.transaction_version(app) is not None:
                found.append(uri)
            continue
        found += [f"{uri}/{n}" for n in _directories(uri) if staged_point(n) is not None]
    return found


def publish(table_uri: str, staged: str) -> int:
    """Make the copy staged at ``staged`` the table at ``table_uri`` (see the module docstring);
    returns how many files it holds. Raises ``SnapshotTableExistsError`` (a
    ``LakeCommitConflictError``, not retried) if a table is already there: another writer
    published or created it first (on an object store too: the log's
    first entry is a create-only PUT, ``durability.put_commit``)."""
    filesystem, staged_base = storage.filesystem(staged)
    _, base = storage.filesystem(table_uri)
    actions = _first_commit(filesystem, staged_base)
    prefix = staged_base.rsplit("/", 1)[-1] + "/"
    files = []
    for action in actions:
        if "add" in action:
            action["add"]["path"] = prefix + action["add"]["path"]
            files.append(action["add"]["path"])
        if "protocol" in action:  # readers that would take a mapped table's columns for NULLs
            action["protocol"] = mapping.spelled_out(action["protocol"])
    if is_local(table_uri):
        for path in files:  # Spark does not fsync: the lake's commit must not outlive its data
            durability.fsync(os.path.join(base, path))
        durability.fsync(staged_base)
    text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    if not durability.put_first_commit(table_uri, text.encode()):
        raise SnapshotTableExistsError(table_uri)
    remove(f"{staged}/{LOG_DIR}")
    return len(files)


def remove(uri: str) -> None:
    """Remove a directory and everything in it, if it exists (a local path or a URI); a table
    opened there in this run is forgotten first (``opened_tables``)."""
    with opened_tables.removing(uri):
        if is_local(uri):
            if os.path.isdir(uri):
                shutil.rmtree(uri)
            return
        filesystem, path = storage.filesystem(uri)
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_dir(path)


def _first_commit(filesystem: Any, staged: str) -> list[dict[str, Any]]:
    """The staged table's only commit, refused unless it is a plain first write."""
    from pyarrow import fs

    log_dir = f"{staged}/{LOG_DIR}"
    infos = filesystem.get_file_info(fs.FileSelector(log_dir, allow_not_found=True))
    versions = sorted(i.base_name for i in infos if _VERSION.fullmatch(i.base_name))
    if versions != [FIRST_COMMIT]:
        raise LakeError(
            f"the copy staged at {staged} holds versions {versions}, not one first write: "
            f"it cannot be published. Nothing was published; take the snapshot again"
        )
    with filesystem.open_input_stream(f"{log_dir}/{FIRST_COMMIT}") as stream:
        lines = stream.read().decode().splitlines()
    actions = [json.loads(line) for line in lines if line.strip()]
    for action in actions:
        add = action.get("add")
        if "remove" in action or "cdc" in action or (add and add.get("deletionVector")):
            raise LakeError(
                f"the copy staged at {staged} is not a plain first write ({next(iter(action))} "
                f"action): it cannot be published. Nothing was published; take the snapshot again"
            )
    return actions


def _directories(uri: str) -> Iterator[str]:
    """Names of the sub-directories of ``uri`` (none if it does not exist), sorted."""
    from pyarrow import fs

    filesystem, base = storage.filesystem(uri)
    infos = filesystem.get_file_info(fs.FileSelector(base, allow_not_found=True))
    yield from sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)
