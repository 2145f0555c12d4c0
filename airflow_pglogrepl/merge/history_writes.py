"""The commits of a history: its creation, an append, a MERGE, a position with no rows.

Each is one Delta version with the app transaction ``(app_id(slot), lake position)``, made right
after the writer lock is proven, and recording in its commit's metadata the state version the
history had seen (``history_state.STATE_VERSION``). The rules are the state's
(``merge.arrow``): a compare-and-set on the transaction version the batch was read against
(the append's and the position's through ``delta.commit_files``; the MERGE's on the snapshot it
was planned on, which delta-rs refuses to commit over a concurrent commit of the same app), the
log made durable before the slot may move.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.history_columns import (
    ENDING_COLUMNS,
    IS_CURRENT,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
)
from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake import delta, durability, row_groups
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lake.storage import delta_options
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.history_changes import conformed
from airflow_pglogrepl.merge.history_versions import Versions
from airflow_pglogrepl.merge.lineage import INTERNAL
from airflow_pglogrepl.merge.net_upserts import quote
from airflow_pglogrepl.merge.state_files import StateFiles

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")

NEW = f"{INTERNAL}new"  # the merge's source row is a version to insert (else one to end)


def create(lake: Lake, uri: str, rows: pa.Table, end: LSN, seen: Mapping[str, str]) -> None:
    """A history's first version: ``rows``, put only if no table appeared meanwhile; configured
    as a new state (deletion vectors as the lake makes them), never under column mapping."""
    config = lake.state_config(uri.rsplit("/", 1)[-1], mapped=False)
    config = {k: v for k, v in config.items() if not k.startswith("delta.columnMapping")}
    with StateFiles(uri, rows.schema, f"{int(end):016X}") as files:
        files.write(rows)

        def commit(written: list[delta.DataFile]) -> None:
            lake.check_writer()
            delta.create_table(uri, rows.schema, written, app=lake.app, version=int(end),
                               configuration=config, metadata=seen)  # fmt: skip

        files.commit(commit)


def append(lake: Lake, uri: str, rows: pa.Table, end: LSN, have: int | None,
           seen: Mapping[str, str]) -> None:  # fmt: skip
    """Versions that end nothing earlier: new files, one commit."""
    with StateFiles(uri, rows.schema, f"{int(end):016X}") as files:
        files.write(rows)

        def commit(written: list[delta.DataFile]) -> None:
            lake.check_writer()
            delta.commit_files(uri, rows.schema, written, app=lake.app, version=int(end),
                               expected=None if have is None else int(have),
                               metadata=seen)  # fmt: skip

        files.commit(commit)


def merge(lake: Lake, uri: str, target: Any, have: int | None, end: LSN, made: Versions,
          stored: pa.Schema, seen: Mapping[str, str]) -> None:  # fmt: skip
    """One MERGE: the versions the batch ends updated (matched by key among the current ones,
    or by their beginning for a table without a key), the new ones inserted."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction

    opened, closes = conformed(made.opened, stored), conformed(made.closed, stored)
    source = pa.concat_tables([opened, closes])
    flags = [True] * opened.num_rows + [False] * closes.num_rows
    source = source.append_column(NEW, pa.array(flags, type=pa.bool_()))
    if made.match == (VALID_FROM_LSN, VALID_FROM_SEQ):
        on = [f"(t.{quote(m)} IS NOT DISTINCT FROM s.{quote(m)})" for m in made.match]
    else:
        on = [f"t.{quote(m)} = s.{quote(m)}" for m in made.match]
    on += [f"t.{quote(IS_CURRENT)}", f"NOT s.{quote(NEW)}"]
    before = int(target.version())
    found = target.transaction_version(lake.app)
    if (None if have is None else int(have)) != found:
        raise LakeCommitConflictError(uri, lake.app, have, found, int(end))
    commit = CommitProperties(app_transactions=[Transaction(lake.app, int(end))],
                              custom_metadata=dict(seen))  # fmt: skip
    lake.check_writer()
    like = opened if opened.num_rows else source  # (the rows its files hold)
    merger = target.merge(source, " AND ".join(on), source_alias="s", target_alias="t",
                          writer_properties=writer_properties(like),
                          commit_properties=commit)  # fmt: skip
    merger = merger.when_matched_update(updates={quote(c): f"s.{quote(c)}" for c in ENDING_COLUMNS})
    insert = {quote(f.name): f"s.{quote(f.name)}" for f in stored}
    metrics = merger.when_not_matched_insert(updates=insert, predicate=f"s.{quote(NEW)}").execute()
    missed = closes.num_rows - int(metrics.get("num_target_rows_updated", closes.num_rows))
    if missed > 0:
        log.warning("history at %s: %d changes ended a version the history does not hold "
                    "(rows it never had)", uri, missed)  # fmt: skip
    if is_local(uri):
        durability.make_log_durable(uri, after=before)
    now = delta.txn_version(uri, lake.app)
    if now != int(end) and (have is None or int(end) > int(have)):
        record(lake, uri, stored, end, have, seen)  # (a MERGE that changed nothing commits none)


def record(lake: Lake, uri: str, stored: pa.Schema, end: LSN, have: int | None,
           seen: Mapping[str, str]) -> None:  # fmt: skip
    """A version with no files that says the history includes the changes up to ``end``."""
    lake.check_writer()
    delta.commit_files(uri, stored, [], app=lake.app, version=int(end),
                       expected=None if have is None else int(have), metadata=seen)  # fmt: skip


def rename(lake: Lake, uri: str, target: Any, renames: Mapping[str, str], seen: int) -> None:
    """Columns renamed at the source renamed in the history: its rows written again under the
    new names, one version at the same position (readers see it whole, or the one before). A
    history is never under column mapping (delta-rs writes it), so a rename is a rewrite."""
    rows = delta.scan(uri, version=int(target.version()))
    rows = rows.rename_columns([renames.get(c, c) for c in rows.column_names])
    _rewrite(lake, uri, target, rows, seen)
    log.info("history at %s: columns renamed %s, every version kept", uri, dict(renames))


def add_filled(lake: Lake, uri: str, target: Any, filled: Mapping[str, Any], types: pa.Schema,
               seen: int) -> None:  # fmt: skip
    """Columns added at the source with a value for the rows from before them (``ADD COLUMN
    ... DEFAULT 7``) added to the history holding it in every version it has (all began before
    the column): one version at the same position, as ``rename``."""
    import pyarrow as pa

    rows = delta.scan(uri, version=int(target.version()))
    for name, value in filled.items():
        kind = types.field(name).type
        rows = rows.append_column(types.field(name), pa.array([value] * rows.num_rows, kind))
    for field in types:  # (other columns added meanwhile, without a fill: NULL)
        if field.name not in rows.column_names:
            rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
    _rewrite(lake, uri, target, rows.select(types.names), seen)
    log.info("history at %s: columns %s added, holding %s in the versions from before them",
             uri, list(filled), dict(filled))  # fmt: skip


def _rewrite(lake: Lake, uri: str, target: Any, rows: pa.Table, seen: int) -> None:
    """The history's rows replaced by ``rows`` in one version, at the position it has."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    from airflow_pglogrepl.merge.history_state import STATE_VERSION

    version = int(target.version())
    have = target.transaction_version(lake.app)
    commit = CommitProperties(
        app_transactions=[Transaction(lake.app, int(have))] if have is not None else None,
        custom_metadata={STATE_VERSION: str(seen)},
    )
    lake.check_writer()
    write_deltalake(uri, rows, mode="overwrite", schema_mode="overwrite",
                    writer_properties=writer_properties(rows), commit_properties=commit,
                    storage_options=delta_options(uri))  # fmt: skip
    if is_local(uri):
        durability.make_log_durable(uri, after=version)


def writer_properties(rows: pa.Table) -> Any:
    """delta-rs' Parquet settings for files of rows like ``rows``: row groups of about
    ``row_groups.ROW_GROUP_BYTES``, as the lake's own writers make them. delta-rs' default (a
    million rows) made groups of 100 MiB of a wide history, and a reader (Spark's next MERGE)
    holds a group's column chunk whole."""
    from deltalake import WriterProperties

    per_row = max(1, rows.nbytes // max(1, rows.num_rows))
    return WriterProperties(max_row_group_size=max(1024, row_groups.ROW_GROUP_BYTES // per_row))
