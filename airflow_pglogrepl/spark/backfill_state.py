"""A backfill's state, built from its chunks and the changelog, and put in place whole.

Built at the lake's position ``E``, which is past the ``high`` of every chunk
(``postgres.backfill`` says why that makes it exact):

1. the chunks' rows, one per key (a row a change moved to another heap block may have been
   read by two chunks: whichever copy is kept, the change that moved it decides its values);
2. every change of ``changes/<table>`` from ``low`` (or from the first commit of a
   transaction that was in progress when the backfill began, if earlier) to ``E``, applied
   over them by the state merge itself (``merge.materialize.merge_range``: the same reduction,
   unchanged TOAST values taken from the row it updates);
3. the result written over ``state/<table>`` as one Delta version carrying the app
   transaction at ``E``: readers see the old state or the new one, and the merges that follow
   take the changes from ``E`` on.

The build is a Delta table beside the chunks (``<rows>-build``), out of any reader's way.
A run killed while building leaves it to be built again from the chunks, which stay until the
state is in place; one killed after the state was written builds the same state again.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_pglogrepl.changelog.columns import COMMIT_LSN, KEY_META, XID
from airflow_pglogrepl.exceptions import LakeMismatchError
from airflow_pglogrepl.lake import backfill as record
from airflow_pglogrepl.lake import delta, mapping, staging
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.lake.schema_commits import spell_out_mapping
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

__all__ = ["build", "build_state", "changes_from", "key_fields", "put_in_place"]

log = logging.getLogger("airflow_pglogrepl.backfill")


def build_state(spark: Any, lake: Lake, plan: record.Plan, end: LSN, *,
                version: int | None = None) -> None:  # fmt: skip
    """Replace ``state/<plan.table>`` with the backfill's state at ``end`` (the lake's
    position, at or past ``plan.high``)."""
    put_in_place(spark, lake, plan, build(spark, lake, plan, end, version=version), end)


def build(spark: Any, lake: Lake, plan: record.Plan, end: LSN, *,
          version: int | None = None) -> str:  # fmt: skip
    """The backfill's state at ``end``, as a Delta table beside its chunks: its URI.
    ``version``: the changelog's Delta version when the lake was at ``end`` (``merge_range``);
    None: the table has no changelog."""
    from airflow_pglogrepl.merge.materialize import merge_range

    ref = TableRef.parse(plan.table)
    name = table_dir(ref)
    have = lake.state_version(name)
    if have is not None and have > end:
        raise LakeMismatchError(f"the state of {plan.table} is already at {have}, past the "
                                f"backfill's build at {end}: run the drain again")  # fmt: skip
    session = spark.newSession()
    rows = record.rows_uri(lake, plan)
    base = session.read.format("delta").load(rows)
    build_uri = f"{rows}-build"
    staging.remove(build_uri)
    (
        base.dropDuplicates([f.name for f in key_fields(base.schema)])
        .write.format("delta")
        .mode("overwrite")
        .options(**lake.state_config(ref, mapped=_mapped(rows)))
        .save(build_uri)
    )
    start = changes_from(session, lake, plan)
    if version is not None:
        merge_range(session, lake, name, build_uri, start, end, version=version)
    log.info("%s: state built from %d chunks and the changes from %s to %s", plan.table,
             record.chunks_done(lake, plan), start, end)  # fmt: skip
    return build_uri


def put_in_place(spark: Any, lake: Lake, plan: record.Plan, build_uri: str, end: LSN) -> None:
    """``build_uri`` written over ``state/<plan.table>`` as one version at ``end``."""
    ref = TableRef.parse(plan.table)
    name = table_dir(ref)
    mapped = _mapped(record.rows_uri(lake, plan))
    if mapped:
        lake.align_state(ref, needed=True)
    writer = (
        spark.newSession().read.format("delta").load(build_uri).write.format("delta")
        .mode("overwrite").option("overwriteSchema", "true")
        .options(**lake.state_config(ref, mapped=mapped))
        .option("userMetadata", delta.REWRITTEN)  # (a history begins again here)
    )  # fmt: skip
    have = lake.state_version(name)
    creates = delta.open_table(lake.paths.state(name)) is None
    if have is None or end > have:  # (at ``have`` already: the version stays, the rows change)
        writer = writer.option("txnAppId", lake.app).option("txnVersion", str(int(end)))
    lake.check_writer()
    writer.save(lake.paths.state(name))
    if creates and mapped:  # readers that would read its columns as NULLs refuse it now
        spell_out_mapping(lake.paths.state(name))
    staging.remove(build_uri)


def key_fields(schema: Any) -> list[Any]:
    """The key's fields of a Spark schema, in key order (``pglogrepl.key``)."""
    keyed = [f for f in schema.fields if KEY_META in f.metadata]
    return sorted(keyed, key=lambda f: int(f.metadata[KEY_META]))


def _mapped(rows: str) -> bool:
    stored = delta.arrow_schema(rows)
    return stored is not None and mapping.needed(stored)


def changes_from(session: Any, lake: Lake, plan: record.Plan) -> LSN:
    """Where the changes applied over the chunks begin: ``low``, or the first commit of the
    table's changes by a transaction in progress when the backfill began, if earlier."""
    from pyspark.sql import functions as sf

    low = LSN(plan.low)
    uri = lake.paths.changes(table_dir(TableRef.parse(plan.table)))
    if not plan.in_progress or delta.open_table(uri) is None:
        return low
    first = (
        session.read.format("delta").load(uri)
        .filter(sf.col(XID).isin(list(plan.in_progress)) & (sf.col(COMMIT_LSN) < int(low)))
        .agg(sf.min(COMMIT_LSN)).first()[0]
    )  # fmt: skip
    return low if first is None else min(low, LSN(int(first)))
