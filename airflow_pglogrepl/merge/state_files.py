"""A state's new data files, written batch by batch and committed once.

Why: a first state, or rows appended to a table without a key, used to be built as one Arrow
table and written at the end, so memory followed the whole batch. Written here as the batches
arrive, each file closed at ``FILE_ROWS`` rows or ``FILE_BYTES`` Arrow bytes (row groups of
``row_groups.ROW_GROUP_BYTES``), memory follows one batch.

The files are invisible to every reader until the one commit names them. So until a commit is
tried, a failure removes them: the lake's vacuum keeps files younger than its retention, and a
run that failed every day would otherwise pile them up. Once a commit is tried they stay,
whatever it raised: it may have landed (an fsync of the log's folder, a store's error after its
PUT, a task timeout), and removing them then would leave a state whose log names missing files.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.lake import delta, durability
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lake.mapping import (
    MODE,
    PROTOCOL_KEYS,
    mapped_of,
    mapped_schema,
    to_physical,
)
from airflow_pglogrepl.lake.row_groups import write_rows
from airflow_pglogrepl.lake.storage import filesystem
from airflow_pglogrepl.lsn import LSN

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")

FILE_ROWS = 1_000_000
FILE_BYTES = 128 << 20


class StateFiles:
    """Data files of the table at ``uri`` with ``schema`` (its stored names), written from
    batches (``write``) and committed once (``commit``). Use as a context manager: leaving it
    by an error before a commit was tried removes every file written."""

    def __init__(self, uri: str, schema: pa.Schema, prefix: str) -> None:
        self.uri, self.schema, self.prefix = uri, schema, prefix
        self.system, self.base = filesystem(uri)
        self.files: list[delta.DataFile] = []
        self.commit_tried = False
        self._writer: Any = None
        self._sink: Any = None  # the writer's stream: closing the writer does not close it
        self._unlisted: list[str] = []  # files whose close failed
        self._path = ""
        self._rows = self._bytes = 0

    def __enter__(self) -> StateFiles:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:  # fmt: skip
        if error is not None and not self.commit_tried:
            self._discard()

    def write(self, rows: pa.Table) -> None:
        """Add ``rows`` (in ``schema``'s names and types) to the files."""
        import pyarrow.parquet as pq

        if rows.num_rows == 0:
            return
        rows = rows.cast(self.schema)
        if self._writer is None:
            self.system.create_dir(self.base, recursive=True)
            self._path = f"{self.base}/{self.prefix}-{uuid.uuid4().hex}.parquet"
            self._sink = self.system.open_output_stream(self._path)
            self._writer = pq.ParquetWriter(self._sink, self.schema, compression="snappy")
        write_rows(self._writer, rows)
        self._rows += rows.num_rows
        self._bytes += rows.nbytes
        if self._rows >= FILE_ROWS or self._bytes >= FILE_BYTES:
            self._close_file()

    def commit(self, commit: Callable[[list[delta.DataFile]], None]) -> int:
        """Close the last file and ``commit`` every file written; the rows they hold."""
        self._close_file()
        self.commit_tried = True
        commit(list(self.files))
        return sum(f.rows for f in self.files)

    def _close_file(self) -> None:
        if self._writer is None:
            return
        writer, sink, path, rows = self._writer, self._sink, self._path, self._rows
        self._writer, self._sink, self._rows, self._bytes = None, None, 0, 0
        try:
            writer.close()
            sink.close()  # on an object store: the upload completes here
            if is_local(self.uri):
                durability.fsync(path)
        except BaseException:
            self._unlisted.append(path)  # written in part: removed with the others
            raise
        name = path.rsplit("/", 1)[-1]
        size = int(self.system.get_file_info(path).size)
        self.files.append(delta.DataFile(name, size, rows, None, tuple(self.schema.names)))

    def _discard(self) -> None:
        """Remove the files written (none is in the table: no commit was tried)."""
        paths = [f"{self.base}/{f.name}" for f in self.files] + self._unlisted
        if self._writer is not None:
            try:
                self._writer.close()
                self._sink.close()
            except Exception:  # the file goes anyway
                log.debug("state file %s not closed cleanly before removal", self._path)
            paths.append(self._path)
            self._writer = self._sink = None
        for path in paths:
            try:
                self.system.delete_file(path)
            except FileNotFoundError:
                continue  # (a partial upload that never became an object)
            except OSError as exc:
                log.warning("file %s of a failed merge not removed (%s): no version of the "
                            "table names it, so it may be deleted by hand", path, exc)  # fmt: skip


class StateTarget:
    """The files of one table's state write (``merge.state_files``), in the state's stored
    names, and the one commit that makes them its next version: a new state's creation (with
    ``Lake.state_config``) or an append that is a compare-and-set on its transaction version."""

    def __init__(self, lake: Lake, name: str, state: pa.Schema, target: Any | None,
                 end: LSN) -> None:  # fmt: skip
        self.lake, self.name, self.state, self.target, self.end = lake, name, state, target, end
        # what the rows were computed against, taken now: the commit is a compare-and-set on it
        # (the target may be a table object another open brings up to date meanwhile)
        self.have = None if target is None else target.transaction_version(lake.app)
        if target is None:
            config = lake.state_config(name)
            self.mapped = mapped_schema(state) if MODE in config else None
            self.config = {k: v for k, v in config.items() if k not in PROTOCOL_KEYS}
        else:
            self.mapped, self.config = mapped_of(target), {}
        stored = state.empty_table()
        stored = stored if self.mapped is None else to_physical(stored, self.mapped)
        self.files = StateFiles(lake.paths.state(name), stored.schema, f"{int(end):016X}")

    def __enter__(self) -> StateTarget:
        self.files.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.files.__exit__(*exc)

    def write(self, rows: pa.Table) -> None:
        """Add ``rows`` (in the state's names and types) to the state's new files."""
        self.files.write(rows if self.mapped is None else to_physical(rows, self.mapped))

    def commit(self) -> int:
        """The one commit of every file written, right after the writer lock is proven; the
        rows it added."""
        uri, lake, end, have = self.lake.paths.state(self.name), self.lake, self.end, self.have

        def commit(files: list[delta.DataFile]) -> None:
            lake.check_writer()
            if self.target is None:
                delta.create_table(uri, self.state, files, app=lake.app, version=int(end),
                                   configuration=self.config, mapping=self.mapped)  # fmt: skip
            else:
                delta.commit_files(uri, self.state, files, app=lake.app, version=int(end),
                                   expected=None if have is None else int(have))  # fmt: skip

        return self.files.commit(commit)
