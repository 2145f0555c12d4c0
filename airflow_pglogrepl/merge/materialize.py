"""Bring each table's ``state/`` up to the lake's position with Spark, one Delta version a table.

For every table whose changelog moved past its state, the changes in ``[state version, lake
position)`` are reduced to their net effect (``reduce.net_changes``) and applied as one Delta
operation carrying the app transaction ``(app_id(slot), lake position)``:

* ``MERGE INTO`` matched by key (or by whole row under REPLICA IDENTITY FULL): only the files
  holding touched rows change, and with deletion vectors (on for the state tables this creates,
  unless the lake says otherwise: ``Lake.state_config``) not even those are rewritten; the cost
  follows the changes, not the table;
* an append, for a table without a replica identity;
* an overwrite, when the batch truncated the table: one version that readers see whole.

Idempotent at every step: a crash before the commit leaves the state at its old version (the
next run merges the same range again); after it, the state's version says it is done, and a
replay of the commit itself is a no-op by its app transaction.

Exclusive as far as Spark allows: a changelog commit is a compare-and-set on the table's
transaction version (``lake.delta.commit_files``), but Spark's ``MERGE`` has no "expected
version"; Delta only refuses it when a commit of the same app id lands while it runs. So the
writer lock is proven (``Lake.check_writer``) before the merge is planned and again right before
it commits. What remains is a run that stalls for longer than its lock session lives between
that proof and the commit, while another run takes the lock and merges the same table: keyed
tables still end right (a merge applies each key's last change), a table without a key could
get the range's rows twice. Tables are merged side by side,
each in its own Spark session (the app transaction of a MERGE is set in session configuration).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    META_COLUMNS,
    OLD,
    SEQ,
    UNCHANGED,
    described_identity,
    described_key,
)
from airflow_pglogrepl.exceptions import MergeStalledError
from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake import delta, evolve, opened_tables
from airflow_pglogrepl.lake.column_names import former_names
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.schema_commits import spell_out_mapping
from airflow_pglogrepl.lake.seen_versions import SeenVersions
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.merge.lineage import column, value_column
from airflow_pglogrepl.merge.net_upserts import DELETE_COLUMN, sent_column
from airflow_pglogrepl.merge.reduce import (
    DELETE_ROW,
    FILL,
    MATCH,
    NetChanges,
    key_column,
    net_changes,
    row_column,
)
from airflow_pglogrepl.merge.stall_watch import STALL_SECONDS, watched

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

log = logging.getLogger("airflow_pglogrepl.lake")

TXN_APP_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


def pending_tables(lake: Lake) -> list[str]:
    """Tables whose changelog holds changes their state does not include yet, read from the
    Delta logs alone (no JVM): a run with none of them needs no Spark at all. Only the logs of
    tables that moved since the last look are read (``lake.seen_versions``)."""
    end = lake.position()
    if end is None:
        return []
    stuck = held_tables(lake)
    seen = SeenVersions(lake.root, lake.app)
    names = [name for name in seen.tables("changes") if name not in stuck]
    seen.still([f"{part}/{name}" for name in names for part in ("changes", "state")])
    pending = [
        name
        for name in names
        if _behind(_lsn(seen, f"state/{name}"), _lsn(seen, f"changes/{name}"), end)
    ]
    seen.save()
    return pending


def _lsn(seen: SeenVersions, name: str) -> LSN | None:
    found = seen.lsn(name)
    return None if found is None else LSN(found)


def held_tables(lake: Lake) -> set[str]:
    """The directory names of the tables in the lake's quarantine: never merged while held (a
    merge would make the state claim the changes the quarantine holds); and of the tables being
    backfilled (``lake.backfill``: the backfill builds their state whole, from the changes)."""
    from airflow_pglogrepl.lake.backfill import backfilling
    from airflow_pglogrepl.lake.layout import table_dir
    from airflow_pglogrepl.lake.quarantine import held

    return {table_dir(ref) for ref in held(lake)} | backfilling(lake)


def _behind(have: LSN | None, held: LSN | None, end: LSN) -> bool:
    """Whether a state that includes changes below ``have`` lacks some of its changelog's
    (below ``held``) up to the lake's position ``end`` (None: no state, no changelog)."""
    if have is not None and have >= end:
        return False
    return held is not None and (have is None or held > have)


@opened_tables.reused()
def materialize(
    spark: Any,
    lake: Lake,
    *,
    tables: list[str] | None = None,
    parallelism: int = 4,
    small_rows: int = arrow_merge.MAX_ROWS,
    stall_seconds: float | None = STALL_SECONDS,
) -> dict[str, str]:
    """Merge the committed changes of ``tables`` (default: ``pending_tables``) into their state;
    returns table -> the LSN its state includes now.

    Small simple batches (at most ``small_rows`` changes, 0: none) are merged without a JVM
    (``merge.arrow``); the others by Spark. ``spark`` is a session, or a function that
    returns one: called only when some table needs Spark, so a run whose batches are all small
    starts no JVM. A table's Spark merge that makes no progress for ``stall_seconds`` is
    cancelled and fails the run (``merge.stall_watch``; 0 or None: never)."""
    end = lake.position()
    if end is None:
        return {}
    names = pending_tables(lake) if tables is None else tables
    if tables is not None and names:
        stuck = held_tables(lake)
        names = [name for name in names if name not in stuck]
    if not names:
        return {}
    for name in names:  # renamed columns, or mapping turned on, since the last merge
        lake.align_state(name)
    reduced: dict[str, arrow_merge.Reduced] = {}
    merged, rest = arrow_merge.merge_small(lake, names, max_rows=small_rows, reduced=reduced)
    if not rest:
        return merged
    session = spark() if callable(spark) else spark

    def merge_one(name: str) -> LSN | None:
        try:
            with watched(session.sparkContext, name, stall_seconds):
                if name in reduced:
                    return merge_reduced(session, lake, reduced[name])
                return materialize_table(session, lake, name, end)
        except MergeStalledError:
            found = lake.state_version(name)
            if found is None or found < end:
                raise
            # the merge committed, and a job after it stalled (Delta's checkpoint after a
            # commit runs in the same thread): the state holds the batch, a checkpoint is
            # optional (the next commit writes one)
            log.warning("state of %s merged up to %s; a Spark job after its commit stalled "
                        "and was cancelled", name, end)  # fmt: skip
            return found

    with ThreadPoolExecutor(max_workers=max(1, parallelism), thread_name_prefix="merge") as pool:
        futures = {name: pool.submit(merge_one, name) for name in rest}
        merged.update({name: str(future.result()) for name, future in futures.items()})
    return merged


def merge_reduced(spark: Any, lake: Lake, batch: arrow_merge.Reduced) -> LSN:
    """Merge a batch reduced in Arrow (``arrow_merge.Reduced``) into a big state with Spark: the
    net change is a local DataFrame, so of Spark's work only the MERGE's own is left (the scan
    that finds the touched files, the deletion vectors, the commit), writing deletion vectors
    instead of rewriting the files delta-rs would."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as sf

    from airflow_pglogrepl.exceptions import LakeCommitConflictError

    name, end = batch.name, batch.end
    path = lake.paths.state(name)
    found = lake.state_version(name)
    if found is not None and found >= end:
        return found  # merged already
    if (None if found is None else int(found)) != batch.have:  # moved since it was reduced
        raise LakeCommitConflictError(path, lake.app, batch.have,
                                      None if found is None else int(found), int(end))  # fmt: skip
    session = spark.newSession()
    source = session.createDataFrame(batch.rows).alias("s")
    deleting = _in_source(DELETE_COLUMN)
    on = _all([_in_target(k) == _in_source(_name(k)) for k in batch.keys])
    update: dict[str, str | Column] = {}
    insert: dict[str, str | Column] = {_name(k): _in_source(_name(k)) for k in batch.keys}
    for i, column_name in enumerate(batch.values):
        sent = _in_source(sent_column(i))
        value = _in_source(_name(column_name))
        update[_name(column_name)] = sf.when(sent, value).otherwise(_in_target(column_name))
        insert[_name(column_name)] = sf.when(sent, value).otherwise(_unsent(column_name))
    fault("merge_created")
    session.conf.set(TXN_APP_CONF, lake.app)
    session.conf.set(TXN_VERSION_CONF, str(int(end)))
    try:
        target = DeltaTable.forPath(session, path).alias("t")
        merge = target.merge(source, on).whenMatchedDelete(condition=deleting)
        if update:
            merge = merge.whenMatchedUpdate(condition=~deleting, set=update)
        lake.check_writer()  # the last moment before the merge commits
        merge.whenNotMatchedInsert(condition=~deleting, values=insert).execute()
    finally:
        session.conf.unset(TXN_APP_CONF)
        session.conf.unset(TXN_VERSION_CONF)
    fault("merge_committed")
    log.info("state of %s merged up to %s by Spark, reduced without it (%d changes, %d keys)",
             name, end, batch.changes, batch.rows.num_rows)  # fmt: skip
    return end


def materialize_table(spark: Any, lake: Lake, name: str, end: LSN, *,
                      version: int | None = None) -> LSN | None:  # fmt: skip
    """Apply ``changes/<name>`` up to ``end`` onto ``state/<name>``; the state's version after.
    ``version``: the changelog's Delta version to read (``merge_range``)."""
    have = lake.state_version(name)
    if not _behind(have, lake.changes_version(name), end):
        return have
    mode = merge_range(spark.newSession(), lake, name, lake.paths.state(name), have, end,
                       version=version)  # fmt: skip
    log.info("state of %s merged up to %s (%s)", name, end, mode)
    return end


def merge_range(session: Any, lake: Lake, name: str, target_path: str, start: LSN | None,
                end: LSN, *, version: int | None = None) -> str:  # fmt: skip
    """Apply the changes of ``changes/<name>`` in ``[start, end)`` (from the first, ``start``
    None) onto the Delta table at ``target_path`` (the state, or a backfill's build of it) as
    one version with ``(lake app, end)``; returns how (``NetChanges.mode``). ``session``: one
    of this table alone. ``version``: the changelog's Delta version to read, the newest by
    default; a backfill's build, which runs while windows append to the changelog, reads the
    one that was newest when the lake was at ``end`` (a later one may carry a column renamed
    after ``end``, which the rows copied before it do not know)."""
    from pyspark.sql import functions as sf

    # one version of the changelog, read by Spark and described by its log alike
    opened = delta.open_table(lake.paths.changes(name), version)
    assert opened is not None, f"changes/{name} is a Delta table"
    changes = (session.read.format("delta").option("versionAsOf", opened.version())
               .load(lake.paths.changes(name)))  # fmt: skip
    fields = [(f.name, f.metadata) for f in changes.schema.fields]
    columns = [f.name for f in changes.schema.fields if f.name not in META_COLUMNS]
    in_range = sf.col(COMMIT_LSN) < sf.lit(int(end))
    if start is not None:
        in_range &= sf.col(COMMIT_LSN) >= sf.lit(int(start))
    described = delta.unmapped(delta.schema_of(opened))
    fills = added_columns(described)
    changes = with_current_names(with_fills(changes, fills), former_names(described))
    config = lake.state_config(name)
    if not _create_if_missing(session, target_path,
                              changes.select(*map(column, columns)).schema, config):  # fmt: skip
        evolve_state(session, target_path, changes, columns, fills)
    fault("merge_created")
    target = session.read.format("delta").load(target_path)
    lake.check_writer()
    net = net_changes(
        changes.filter(in_range),
        target,
        key=described_key(fields),
        columns=columns,
        full_identity=described_identity(fields) == "f",
        table=name,
    )
    lake.check_writer()  # the last moment before the merge commits: see below
    apply(session, net, target_path, app=lake.app, version=int(end))
    fault("merge_committed")
    return net.mode


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
    on = _all([_in_target(k) == _in_source(key_column(j)) for j, k in enumerate(net.keys)])
    deleting = _in_source(DELETE_ROW)
    update: dict[str, Column] = {}
    insert: dict[str, Column] = {
        _name(k): _in_source(key_column(j)) for j, k in enumerate(net.keys)
    }
    for i, name in enumerate(net.values):
        sent = _in_source(value_column(i))
        unsent = _unsent(name)
        update[_name(name)] = (
            sf.when(sent.isNotNull(), sent.getField("v"))
            .when(_in_source(FILL) == "target", _in_target(name))
            .otherwise(unsent)
        )
        insert[_name(name)] = sf.when(sent.isNotNull(), sent.getField("v")).otherwise(unsent)
    merge = target.merge(source, on).whenMatchedDelete(condition=deleting)
    if update:
        merge = merge.whenMatchedUpdate(condition=~deleting, set=update)
    merge.whenNotMatchedInsert(condition=~deleting, values=insert).execute()


def _merge_multiset(target: Any, net: NetChanges) -> None:
    source = net.rows.alias("s")
    on = _in_source(MATCH) & _all(
        [_in_target(c).eqNullSafe(_in_source(row_column(i))) for i, c in enumerate(net.columns)]
    )
    values = {_name(c): _in_source(row_column(i)) for i, c in enumerate(net.columns)}
    (
        target.merge(source, on)
        .whenMatchedDelete()
        .whenNotMatchedInsert(condition=~_in_source(MATCH), values=values)
        .execute()
    )


def _create_if_missing(session: Any, path: str, schema: Any, config: dict[str, str]) -> bool:
    """An empty state table with ``config`` (``Lake.state_config``: with deletion vectors on,
    Spark's merges write vectors; off, they rewrite files, and the table has no reader feature
    that readers without vectors refuse); False: there is one already."""
    existing = delta.open_table(path)
    if existing is not None:
        spell_out_mapping(path, existing)  # (one a run killed right after its creation)
        return False
    empty = session.createDataFrame([], schema)
    empty.write.format("delta").options(**config).mode("append").save(path)
    spell_out_mapping(path)  # before a row is in it: readers that would see NULLs refuse it
    return True


@dataclass(frozen=True)
class Added:
    """A column added after the table's changelog began: rows before ``at`` hold ``fill``."""

    name: str
    at: tuple[int, int]  # (commit LSN, seq) of the first change that carried it
    fill: Any  # the lake value (None: NULL)


def added_columns(schema: pa.Schema) -> list[Added]:
    """The columns of a changelog schema that ``lake.evolve`` recorded as added."""
    found = []
    for field in evolve.base_fields(schema):
        at = evolve.added_at(field)
        if at is not None:
            found.append(Added(field.name, at, evolve.fill_value(field)))
    return found


def with_fills(changes: DataFrame, fills: list[Added]) -> DataFrame:
    """Changelog rows from before a column was added read its fill there, as PostgreSQL's rows
    do (a whole old row under REPLICA IDENTITY FULL too: the merge matches rows by it)."""
    from pyspark.sql import functions as sf

    for added in fills:
        if added.fill is None:
            continue  # rows from before it read NULL, as Delta already reads them
        lsn, seq = added.at
        before = (sf.col(COMMIT_LSN) < lsn) | ((sf.col(COMMIT_LSN) == lsn) & (sf.col(SEQ) < seq))
        kind = changes.schema[added.name].dataType
        value = spark_literal(added.fill, kind)
        changes = changes.withColumn(
            added.name, sf.when(before, value).otherwise(column(added.name))
        )
        old = sf.col(OLD)
        filled_old = old.withField(
            _name(added.name), sf.when(before, value).otherwise(old.getField(added.name))
        )
        changes = changes.withColumn(OLD, sf.when(old.isNull(), old).otherwise(filled_old))
    return changes


def with_current_names(changes: DataFrame, formers: dict[str, str]) -> DataFrame:
    """Changelog rows with each entry of ``_unchanged`` under its column's name now: rows
    written before a column was renamed name it as it was then
    (``lake.column_names.FORMER_META``)."""
    from pyspark.sql import functions as sf

    if not formers:
        return changes

    def current(entry: Column) -> Column:
        result = entry
        for former, now in formers.items():
            result = sf.when(entry == sf.lit(former), sf.lit(now)).otherwise(result)
        return result

    return changes.withColumn(UNCHANGED, sf.transform(sf.col(UNCHANGED), current))


def evolve_state(
    session: Any, path: str, changes: DataFrame, columns: list[str], fills: list[Added]
) -> None:
    """Give the state table the changelog's columns it lacks, as one version readers see whole:
    existing rows hold each new column's fill (metadata only when every fill is NULL)."""
    from pyspark.sql import functions as sf

    state = session.read.format("delta").load(path)
    missing = [c for c in columns if c not in state.columns]
    if not missing:
        return
    fill = {a.name: a.fill for a in fills}
    kinds = {c: changes.schema[c].dataType for c in missing}
    if all(fill.get(c) is None for c in missing):
        nulls = [sf.lit(None).cast(kinds[c]).alias(c) for c in missing]
        wider = state.select(*map(column, state.columns), *nulls).limit(0)
        wider.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    else:
        filled = state.select(
            *map(column, state.columns),
            *(spark_literal(fill.get(c), kinds[c]).alias(c) for c in missing),
        )
        filled.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    log.info("state %s: columns %s added (existing rows hold %s)", path, missing,
             {c: fill.get(c) for c in missing})  # fmt: skip


def spark_literal(value: Any, kind: Any) -> Column:
    """A Spark literal of type ``kind`` for a lake value (structs and arrays included)."""
    from pyspark.sql import functions as sf
    from pyspark.sql.types import ArrayType, StructType

    if value is None:
        return sf.lit(None).cast(kind)
    if isinstance(kind, StructType):
        return sf.struct(*(spark_literal(value.get(f.name), f.dataType).alias(f.name)
                           for f in kind.fields))  # fmt: skip
    if isinstance(kind, ArrayType):
        items = [spark_literal(v, kind.elementType) for v in value]
        return (sf.array(*items) if items else sf.array()).cast(kind)
    return sf.lit(value).cast(kind)


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


def _in_target(name: str) -> Column:
    """The MERGE target's column ``name`` (a table column: quoted)."""
    from pyspark.sql import functions as sf

    return sf.col("t." + _name(name))


def _in_source(name: str) -> Column:
    """The MERGE source's column ``name``, as given (a table column's name comes quoted)."""
    from pyspark.sql import functions as sf

    return sf.col("s." + name)


def _all(conditions: list[Column]) -> Column:
    from functools import reduce

    return reduce(lambda a, b: a & b, conditions)
