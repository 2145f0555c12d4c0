"""Bring each table's ``state/`` up to the lake's position with Spark, one Delta version a table.

For every table whose changelog moved past its state, the changes in ``[state version, lake
position)`` are reduced to their net effect (``reduce.net_changes``) and applied as one Delta
operation carrying the app transaction ``(app_id(slot), lake position)``:

* ``MERGE INTO`` matched by key (or by whole row under REPLICA IDENTITY FULL): only the files
  holding touched rows change, and with deletion vectors (on for every state table this creates)
  not even those are rewritten; the cost follows the changes, not the table;
* an append, for a table without a replica identity;
* an overwrite, when the batch truncated the table: one version that readers see whole.

Idempotent at every step: a crash before the commit leaves the state at its old version (the
next run merges the same range again); after it, the state's version says it is done, and a
replay of the commit itself is a no-op by its app transaction. Tables are merged side by side,
each in its own Spark session (the app transaction of a MERGE is set in session configuration).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake.changelog import (
    COMMIT_LSN,
    META_COLUMNS,
    described_identity,
    described_key,
)
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.reduce import (
    DELETE_ROW,
    FILL,
    MATCH,
    NetChanges,
    column,
    key_column,
    net_changes,
    row_column,
    value_column,
)
from airflow_pglogrepl.lsn import LSN

if TYPE_CHECKING:
    from pyspark.sql import Column

log = logging.getLogger("airflow_pglogrepl.lake")

TXN_APP_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


def pending_tables(lake: Lake) -> list[str]:
    """Tables whose changelog holds changes their state does not include yet, read from the
    Delta logs alone (no JVM): a run with none of them needs no Spark at all."""
    end = lake.position()
    if end is None:
        return []
    return [name for name in lake.changes_tables() if _behind(lake, name, end)]


def _behind(lake: Lake, name: str, end: LSN) -> bool:
    have = lake.state_version(name)
    if have is not None and have >= end:
        return False
    held = lake.changes_version(name)
    return held is not None and (have is None or held > have)


def materialize(
    spark: Any, lake: Lake, *, tables: list[str] | None = None, parallelism: int = 4
) -> dict[str, str]:
    """Merge the committed changes of ``tables`` (default: ``pending_tables``) into their state;
    returns table -> the LSN its state includes now."""
    end = lake.position()
    if end is None:
        return {}
    names = pending_tables(lake) if tables is None else tables
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, parallelism), thread_name_prefix="merge") as pool:
        futures = {name: pool.submit(materialize_table, spark, lake, name, end) for name in names}
        return {name: str(future.result()) for name, future in futures.items()}


def materialize_table(spark: Any, lake: Lake, name: str, end: LSN) -> LSN | None:
    """Apply ``changes/<name>`` up to ``end`` onto ``state/<name>``; the state's version after."""
    from pyspark.sql import functions as sf

    have = lake.state_version(name)
    if not _behind(lake, name, end):
        return have
    session = spark.newSession()
    changes = session.read.format("delta").load(lake.paths.changes(name))
    fields = [(f.name, f.metadata) for f in changes.schema.fields]
    columns = [f.name for f in changes.schema.fields if f.name not in META_COLUMNS]
    in_range = sf.col(COMMIT_LSN) < sf.lit(int(end))
    if have is not None:
        in_range &= sf.col(COMMIT_LSN) >= sf.lit(int(have))
    state_path = lake.paths.state(name)
    _create_if_missing(session, state_path, changes.select(*(column(c) for c in columns)).schema)
    fault("merge_created")
    target = session.read.format("delta").load(state_path)
    net = net_changes(
        changes.filter(in_range),
        target,
        key=described_key(fields),
        columns=columns,
        full_identity=described_identity(fields) == "f",
        table=name,
    )
    apply(session, net, state_path, app=lake.app, version=int(end))
    fault("merge_committed")
    log.info("state of %s merged up to %s (%s)", name, end, net.mode)
    return end


def apply(session: Any, net: NetChanges, path: str, *, app: str, version: int) -> None:
    """Apply ``net`` to the Delta table at ``path`` as one version with ``(app, version)``.

    ``session`` must be a session of this table alone (``spark.newSession()``): a MERGE takes
    its app transaction from session configuration.
    """
    if net.mode in ("append", "replace"):
        writer = net.rows.write.format("delta").option("txnAppId", app)
        writer = writer.option("txnVersion", str(version))
        writer.mode("overwrite" if net.mode == "replace" else "append").save(path)
        return
    from delta.tables import DeltaTable

    session.conf.set(TXN_APP_CONF, app)
    session.conf.set(TXN_VERSION_CONF, str(version))
    try:
        target = DeltaTable.forPath(session, path).alias("t")
        if net.mode == "upsert":
            _merge_upserts(target, net)
        else:
            _merge_multiset(target, net)
    finally:
        session.conf.unset(TXN_APP_CONF)
        session.conf.unset(TXN_VERSION_CONF)


def _merge_upserts(target: Any, net: NetChanges) -> None:
    from pyspark.sql import functions as sf

    source = net.rows.alias("s")
    on = _all([_t(k) == _s(key_column(j)) for j, k in enumerate(net.keys)])
    deleting = _s(DELETE_ROW)
    update: dict[str, Column] = {}
    insert: dict[str, Column] = {_name(k): _s(key_column(j)) for j, k in enumerate(net.keys)}
    for i, name in enumerate(net.values):
        sent = _s(value_column(i))
        unsent = _unsent(name)
        update[_name(name)] = (
            sf.when(sent.isNotNull(), sent.getField("v"))
            .when(_s(FILL) == "target", _t(name))
            .otherwise(unsent)
        )
        insert[_name(name)] = sf.when(sent.isNotNull(), sent.getField("v")).otherwise(unsent)
    merge = target.merge(source, on).whenMatchedDelete(condition=deleting)
    if update:
        merge = merge.whenMatchedUpdate(condition=~deleting, set=update)
    merge.whenNotMatchedInsert(condition=~deleting, values=insert).execute()


def _merge_multiset(target: Any, net: NetChanges) -> None:
    source = net.rows.alias("s")
    on = _s(MATCH) & _all([_t(c).eqNullSafe(_s(row_column(i))) for i, c in enumerate(net.columns)])
    values = {_name(c): _s(row_column(i)) for i, c in enumerate(net.columns)}
    (
        target.merge(source, on)
        .whenMatchedDelete()
        .whenNotMatchedInsert(condition=~_s(MATCH), values=values)
        .execute()
    )


def _create_if_missing(session: Any, path: str, schema: Any) -> None:
    """An empty state table with deletion vectors on (so merges write deletion vectors)."""
    from airflow_pglogrepl.lake import delta

    if delta.open_table(path) is not None:
        return
    empty = session.createDataFrame([], schema)
    empty.write.format("delta").option("delta.enableDeletionVectors", "true").mode("append").save(
        path
    )


def _unsent(name: str) -> Column:
    from pyspark.sql import functions as sf

    return sf.raise_error(
        sf.lit(
            f"unchanged TOAST value of column {name!r} has no earlier version to keep: an "
            "UPDATE reached a row that is neither in the previous state nor inserted earlier"
        )
    )


def _name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _t(name: str) -> Column:
    from pyspark.sql import functions as sf

    return sf.col("t." + _name(name))


def _s(name: str) -> Column:
    from pyspark.sql import functions as sf

    return sf.col("s." + name)


def _all(conditions: list[Column]) -> Column:
    from functools import reduce

    return reduce(lambda a, b: a & b, conditions)
