"""A history's MERGE on Spark, for a history too big to rewrite the files a batch touches.

delta-rs' MERGE is copy-on-write: every file holding a version the batch ends is written again
whole. A history grows with every change its table ever had, and the versions a batch ends are
spread over its files (each row's current version lies where its last change landed), so past a
size most of the history would be written again each run. Spark's MERGE marks the ended
versions in deletion vectors and writes only their new rows, as the state's big merges do
(``merge.materialize.merge_reduced``). The batch is reduced to versions without a JVM either
way (``merge.history_versions``); only the MERGE itself runs on Spark.

The commit follows the rules of ``merge.history_writes``: the writer lock proven right before
it, the app transaction ``(app, end)`` (Spark's ``txnAppId``/``txnVersion``, which skips a
version it has), a compare-and-set on the position the batch was read against, the log made
durable before the slot may move, and the state version seen in the commit's ``userMetadata``.
"""

from __future__ import annotations

import json
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
from airflow_pglogrepl.lake import delta, durability
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.history_changes import conformed
from airflow_pglogrepl.merge.history_versions import Versions
from airflow_pglogrepl.merge.history_writes import NEW, record

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")

SPARK_BYTES = 256 << 20  # a history past this many bytes of files ends its versions on Spark
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def on_spark(target: Any, made: Versions, limit: int | None = None) -> bool:
    """Whether ``made`` is merged into ``target`` on Spark: it ends versions (an append rewrites
    nothing), and the history's files are past ``limit`` bytes (default ``SPARK_BYTES``)."""
    limit = SPARK_BYTES if limit is None else limit
    return made.closed.num_rows > 0 and sum(delta.file_sizes(target)) > limit


def user_metadata(seen: Mapping[str, str]) -> str:
    """What a Spark commit says in ``userMetadata``: the keys a delta-rs commit puts beside it
    (``history_state.seen_state_version`` reads both)."""
    return json.dumps(dict(seen), sort_keys=True)


def merge_on_spark(session: Any, lake: Lake, uri: str, target: Any, have: int | None, end: LSN,
                   made: Versions, stored: pa.Schema, seen: Mapping[str, str]) -> None:  # fmt: skip
    """``merge`` of ``history_writes`` on Spark: the versions the batch ends updated, the new
    ones inserted, one commit. ``session``: a session of this table alone
    (``spark.newSession()``), whose configuration carries the commit's transaction."""
    import pyarrow as pa
    from delta.tables import DeltaTable

    from airflow_pglogrepl.merge.materialize import TXN_APP_CONF, TXN_VERSION_CONF

    opened, closes = conformed(made.opened, stored), conformed(made.closed, stored)
    rows = pa.concat_tables([opened, closes])
    flags = [True] * opened.num_rows + [False] * closes.num_rows
    rows = rows.append_column(NEW, pa.array(flags, type=pa.bool_()))
    source = session.createDataFrame(rows).alias("s")
    if made.match == (VALID_FROM_LSN, VALID_FROM_SEQ):
        on = [_col("t", m).eqNullSafe(_col("s", m)) for m in made.match]
    else:
        on = [_col("t", m) == _col("s", m) for m in made.match]
    condition = _col("t", IS_CURRENT) & ~_col("s", NEW)
    for part in on:
        condition = condition & part
    before = int(target.version())
    if have is not None and int(have) >= int(end):  # (Spark skips a version it has)
        raise ValueError(f"a Spark MERGE must move the history's position: {have} to {end}")
    settings = {TXN_APP_CONF: lake.app, TXN_VERSION_CONF: str(int(end)),
                USER_METADATA_CONF: user_metadata(seen)}  # fmt: skip
    for key, value in settings.items():
        session.conf.set(key, value)
    try:
        table = DeltaTable.forPath(session, uri).alias("t")
        merger = table.merge(source, condition).whenMatchedUpdate(
            set={_quoted(c): _col("s", c) for c in ENDING_COLUMNS}
        )
        insert = {_quoted(f.name): _col("s", f.name) for f in stored}
        lake.check_writer()  # the last moment before the merge commits
        _unmoved(lake, uri, have, before, end)
        result = merger.whenNotMatchedInsert(condition=_col("s", NEW), values=insert).execute()
    finally:
        for key in settings:
            session.conf.unset(key)
    if is_local(uri):
        durability.make_log_durable(uri, after=before)
    rows = [] if result is None else result.collect()
    metrics = rows[0].asDict() if rows else {}
    missed = closes.num_rows - int(metrics.get("num_updated_rows", closes.num_rows))
    if missed > 0:
        log.warning("history at %s: %d changes ended a version the history does not hold "
                    "(rows it never had)", uri, missed)  # fmt: skip
    if delta.txn_version(uri, lake.app) != int(end) and (have is None or int(end) > int(have)):
        record(lake, uri, stored, end, have, seen)  # (a MERGE that changed nothing commits none)
    log.info("history at %s merged up to %s on Spark: %d versions opened, %d ended", uri, end,
             opened.num_rows, closes.num_rows)  # fmt: skip


def _unmoved(lake: Lake, uri: str, have: int | None, before: int, end: LSN) -> None:
    """The compare-and-set: the history is still at the position and the version the batch
    was planned on (Spark's MERGE runs on the newest table, whatever it was planned on)."""
    now = delta.open_table(uri)
    found = None if now is None else now.transaction_version(lake.app)
    if found != (None if have is None else int(have)) or now is None or now.version() != before:
        raise LakeCommitConflictError(uri, lake.app, have, found, int(end))


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _col(alias: str, name: str) -> Any:
    """Column ``name`` of the MERGE's target (``t``) or source (``s``), quoted."""
    from pyspark.sql import functions as sf

    return sf.col(f"{alias}.{_quoted(name)}")
