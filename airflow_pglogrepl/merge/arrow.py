"""Merge a small batch of a keyed table into its state without a JVM, through delta-rs.

Why: a Spark ``MERGE`` costs seconds of fixed work per table whatever its size (about 35 Spark
jobs for a batch of 49 changes: planning probes, the reduction's shuffles, the MERGE's own
passes), so a drain of 40 small tables spent almost three minutes merging 1,960 changes. Most
batches are small and simple, and for those the reduction is a sort and a group-by in Arrow and
the merge one ``deltalake`` MERGE: milliseconds.

Which batches: a keyed table (primary key or unique index as replica identity), no ``TRUNCATE``
and no update that moved a row to another key in the batch; one group-by per key gives their
net change (``merge.net_upserts`` says why). Everything else (TRUNCATE, key changes, updates and
deletes under REPLICA IDENTITY FULL, columns added with a fill, a state that lacks a column, a big
batch or a big state) is declined, from the schemas before a row is read where it can be
(``_plan``), and goes to Spark, whose reduction handles all of it.

A table without a key (no replica identity, or REPLICA IDENTITY FULL) has a multiset of rows for
its state: a batch of inserts alone adds one copy of each row, so it is appended as it is
(``_append``). That is the common keyless table, an audit or history log, merged in milliseconds
where Spark's multiset merge started a JVM.

A table's first state (no state table yet) is the same net change written as one append that
creates the table: no MERGE and no files to rewrite. Reduced in memory up to ``IN_MEMORY_ROWS``
changes and ``IN_MEMORY_BYTES``, above that bucket by bucket on local disk (``merge.buckets``),
so memory follows a bucket, not the run. That is what an initial load through the slot (no
snapshot) costs: a million and more changes, which Spark's MERGE into an empty table took about
a minute for.

What is read is sized in bytes before a row is read (``InRange.size_bytes``): rows of 16 KiB
made a batch of 100,000 changes 1.6 GB. The changelog is read in batches of ``BATCH_BYTES``,
and the state's new files are written as the batches arrive (``merge.state_files``).

Exactly once, as on the Spark path and a little more: the MERGE carries the app transaction
``(app_id(slot), lake position)``, is made on the snapshot whose transaction version was read
as the batch's lower bound (delta-rs refuses to commit over a concurrent commit of the same app
id: a compare-and-set), and the writer lock is proven right before it. delta-rs reads the
state's deletion vectors and writes none (it rewrites the files holding touched rows), so the
state stays readable by every reader, and Spark's later merges write vectors again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    INSERT,
    META_COLUMNS,
    OLD,
    OP,
    SEQ,
    TRUNCATE,
    UNCHANGED,
    described_identity,
    described_key,
)
from airflow_pglogrepl.exceptions import LakeCommitConflictError, PgLogReplError
from airflow_pglogrepl.faults import fault
from airflow_pglogrepl.lake import delta, durability
from airflow_pglogrepl.lake.column_names import former_names, with_current_names
from airflow_pglogrepl.lake.evolve import added_at, base_fields, fill_value
from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.buckets import BUCKET_BYTES
from airflow_pglogrepl.merge.changes_range import InRange
from airflow_pglogrepl.merge.first_state import DeclinedError, in_buckets, missing_row, wanted
from airflow_pglogrepl.merge.lineage import INTERNAL
from airflow_pglogrepl.merge.net_upserts import (
    DELETE_COLUMN,
    net_upserts,
    quote,
    sent_column,
    updates_of_missing_rows,
)
from airflow_pglogrepl.merge.state_files import StateTarget

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pglogrepl.lake.lake import Lake

log = logging.getLogger("airflow_pglogrepl.lake")

# Changelog rows of one table's batch merged into an existing state here at most, and the state
# size (bytes of data files) it rewrites into at most: delta-rs rewrites every file a touched key
# is in, Spark writes deletion vectors instead.
MAX_ROWS = 100_000
MAX_STATE_BYTES = 256 << 20
# A keyed batch into an existing state is read here (for delta-rs' MERGE, or reduced for Spark's:
# ``Reduced``) up to this many Arrow bytes; a bigger one Spark reads from the changelog itself
# (a reduced batch reaches Spark as a local relation in the driver's heap: 40,000 rows of 16 KiB
# hung the merge with the heap full).
READ_BYTES = 64 << 20
# A table's first state (one append, no files to rewrite) is reduced in memory at once up to
# these; a bigger one key hash bucket by key hash bucket on local disk (``merge.buckets``), which
# is faster from a bucket's size on (a sort of the whole batch at once: 2.8 s and 783 MiB of
# peak for the benchmark workload's 1,250,000 changes, 1.1 s and 516 MiB in buckets).
IN_MEMORY_ROWS = 2_000_000
IN_MEMORY_BYTES = BUCKET_BYTES


@dataclass(frozen=True)
class Reduced:
    """A batch's net change (``net_upserts``, cast to the state's types), reduced here for a
    state too big for delta-rs' copy-on-write MERGE: Spark merges it
    (``materialize.merge_reduced``) without planning the reduction's shuffles again."""

    name: str
    end: LSN
    have: int | None  # the state's transaction version the batch was read against
    keys: tuple[str, ...]
    values: tuple[str, ...]
    rows: pa.Table
    changes: int


def merge_small(
    lake: Lake,
    tables: Sequence[str],
    *,
    max_rows: int = MAX_ROWS,
    reduced: dict[str, Reduced] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Merge here each of ``tables`` this path takes, up to the lake's position; returns the
    merged tables (table -> the LSN its state includes now) and the declined ones, for Spark.

    With ``reduced``, a table declined only because its state is too big to rewrite is reduced
    here anyway and its net change put there (it is still among the declined)."""
    end = lake.position()
    if end is None or max_rows <= 0:
        return {}, list(tables)
    merged: dict[str, str] = {}
    declined: list[str] = []
    for name in tables:
        try:
            why = merge_table(lake, name, end, max_rows=max_rows, reduced=reduced)
        except PgLogReplError:
            raise  # the lake's own refusals (a lost lock, a row nowhere): not Spark's to redo
        except Exception as exc:  # delta-rs's own classes: nothing was committed
            if delta.lost_race(exc):
                found = lake.state_version(name)
                raise LakeCommitConflictError(
                    lake.paths.state(name), lake.app, None,
                    None if found is None else int(found), int(end),
                ) from None  # fmt: skip
            log.warning("state of %s: the merge without a JVM failed (%s: %s); Spark merges it",
                        name, type(exc).__name__, exc, exc_info=True)  # fmt: skip
            why = "failed here"
        if why is None:
            merged[name] = str(end)
        else:
            log.info("state of %s merged by Spark: %s", name, why)
            declined.append(name)
    return merged, declined


def merge_table(
    lake: Lake,
    name: str,
    end: LSN,
    *,
    max_rows: int = MAX_ROWS,
    reduced: dict[str, Reduced] | None = None,
) -> str | None:
    """Merge ``changes/<name>`` up to ``end`` into ``state/<name>`` here; None when done, else
    why this path declines the table (nothing was written). A state too big to rewrite here
    is declined after its batch is reduced, into ``reduced`` when given (``merge_small``)."""
    target = delta.open_table(lake.paths.state(name))
    have = None if target is None else target.transaction_version(lake.app)
    if have is not None and int(have) >= int(end):
        return None  # merged already (a replay): nothing to do
    changes = delta.open_table(lake.paths.changes(name))
    if changes is None:
        return "no changelog"
    plan = _plan(target, None if have is None else int(have), changes, max_rows)
    if isinstance(plan, str):
        return plan
    if plan.too_big is not None and reduced is None:
        return plan.too_big
    try:
        in_range = InRange(changes, plan.schema, plan.have, int(end))
        count = in_range.count()  # before reading: the batch may be huge
    except Exception as exc:  # delta-rs raises its own classes for what it cannot read so
        return f"changelog not readable here ({type(exc).__name__}: {exc})"
    if count == 0 and target is not None:  # nothing in range (a commit of no rows): record it
        lake.check_writer()
        _record_position(lake.paths.state(name), lake.app, plan.state, end, plan.have)
        return None
    if count == 0:
        return "0 changes"
    try:
        if not plan.keys:  # an append takes inserts alone: known from one column, before the batch
            operations = in_range.operations()
            if operations - {INSERT}:
                return _not_appendable(plan.full, operations)
            return _append(lake, name, end, target, in_range, plan)
        if target is not None:
            batch = None if count > plan.limit else _read_batch(in_range, plan, READ_BYTES)
            if batch is None:
                return (f"{count} changes, more than {READ_BYTES >> 20} MiB or {plan.limit} "
                        f"changes (Spark reads them from the changelog itself)")  # fmt: skip
            return _merge_keyed(lake, name, end, plan, batch, reduced)
        size = in_range.size_bytes(_needed(plan))
        if count <= IN_MEMORY_ROWS and size <= IN_MEMORY_BYTES:
            batch = _read_batch(in_range, plan, IN_MEMORY_BYTES)
            if batch is not None:
                return _merge_keyed(lake, name, end, plan, batch, reduced)
            # more bytes than the estimate said (rows that grow, repeated values Parquet
            # stores small): sized again from what the read saw
            size = max(size, in_range.seen_bytes * count // max(1, in_range.seen_rows))
        return in_buckets(lake, name, end, in_range, size, plan.schema, plan.state, keys=plan.keys,
                          columns=plan.columns, needed=_needed(plan))  # fmt: skip
    except DeclinedError as declined:
        return str(declined)


@dataclass(frozen=True)
class _Plan:
    """What ``_plan`` found from the schemas alone, before a row is read: found once, so that
    the steps after it read the batch and write the state by the same answers."""

    target: Any | None  # the state (None: none yet)
    have: int | None  # the state's transaction version the batch is read against
    schema: pa.Schema  # the changelog's, by logical names
    columns: list[str]  # the table's own, without the changelog's metadata columns
    keys: list[str]  # empty: a keyless table (no replica identity, or FULL), appended
    full: bool  # REPLICA IDENTITY FULL
    state: pa.Schema  # the state's (or the first state's) columns and types
    limit: int  # changes this path reads into memory at most
    too_big: str | None  # why the state is too big to rewrite here, when it is


def _plan(target: Any | None, have: int | None, changes: Any, max_rows: int) -> _Plan | str:
    """The path of a table's batch from the changelog's and the state's schemas (a str: why this
    path declines it), before a row is read: what the schemas decline costs no read."""
    import pyarrow as pa

    schema = delta.unmapped(pa.schema(changes.schema().to_arrow()))
    fields = [(f.name, _text(f.metadata)) for f in schema]
    full = described_identity(fields) == "f"
    keys = [] if full else described_key(fields)  # FULL: rows match by every column
    if any(added_at(f) is not None and fill_value(f) is not None for f in base_fields(schema)):
        return "a column added with a value for older rows"
    columns = [n for n, _ in fields if n not in META_COLUMNS]
    if any(c.startswith(INTERNAL) for c in columns):
        return f"a column named like this path's own ({INTERNAL}...)"
    if any(pa.types.is_nested(schema.field(k).type) for k in keys):
        return "a key of a nested type (Arrow groups only by plain values)"
    if any(pa.types.is_floating(schema.field(k).type) for k in keys):
        return "a floating-point key (-0.0 and 0.0 group apart in Arrow, equal in a MERGE)"
    too_big = None
    if target is None:
        state = pa.schema([schema.field(c) for c in columns])
        limit = max(max_rows, IN_MEMORY_ROWS)
    else:
        state = delta.unmapped(pa.schema(target.schema().to_arrow()))
        if any(c not in state.names for c in columns):
            return "new columns for the state"
        limit = max_rows
        size = sum(delta.file_sizes(target)) if keys else 0  # an append rewrites nothing
        if size > MAX_STATE_BYTES:
            too_big = f"a state of {size} bytes (this path rewrites the files it touches)"
    return _Plan(target, have, schema, columns, keys, full, state, limit, too_big)


def _needed(plan: _Plan) -> list[str]:
    """The changelog columns the reduction reads (not the transaction id, commit time ...)."""
    needed = [*plan.columns, OP, COMMIT_LSN, SEQ, UNCHANGED, OLD]
    return [c for c in needed if c in plan.schema.names]


def _read_batch(in_range: InRange, plan: _Plan, limit_bytes: int) -> pa.Table | None:
    """The batch in range, each column by its current name, with only what the reduction reads,
    held in memory whole; None as soon as it reads more than ``limit_bytes`` of Arrow data (an
    estimate is only an estimate: this bound is what was read)."""
    import pyarrow as pa

    parts, held = [], 0
    for part in in_range.batches(_needed(plan)):
        held += part.nbytes
        if held > limit_bytes:
            return None
        parts.append(part)
    if not parts:
        return None
    batch = pa.concat_tables(parts)
    # rows from before a rename name the column as it was then
    return with_current_names(batch, former_names(plan.schema))


def _merge_keyed(lake: Lake, name: str, end: LSN, plan: _Plan, batch: pa.Table,
                 reduced: dict[str, Reduced] | None) -> str | None:  # fmt: skip
    """A keyed table's batch as its net change: put in ``reduced`` for Spark when the state is
    too big to rewrite here, else written (``_write_upserts``) unless it would insert NULLs for
    unsent values with no row to keep them from, which fails here as on Spark's path."""
    import pyarrow as pa

    keys, columns = plan.keys, plan.columns
    values = [c for c in columns if c not in keys]
    net = net_upserts(batch, keys, values)
    if net is None:
        return "a TRUNCATE or a key change"
    if plan.too_big is not None and reduced is not None:
        try:
            rows = net.cast(wanted(net, plan.state, columns))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            return f"types the state holds differently ({exc})"
        reduced[name] = Reduced(name, end, plan.have, tuple(keys), tuple(values), rows,
                                batch.num_rows)  # fmt: skip
        return f"{plan.too_big}; reduced here ({batch.num_rows} changes, {net.num_rows} keys)"
    missing = updates_of_missing_rows(plan.target, net, keys, values)  # (no state: every such row)
    if missing is None:
        return "an update with unchanged TOAST values to check against a non-integer, non-text key"
    if missing:
        raise missing_row(name, missing[0])
    return _write_upserts(lake, name, end, plan, net, values, batch.num_rows)


def _write_upserts(lake: Lake, name: str, end: LSN, plan: _Plan, net: pa.Table,
                   values: list[str], changes: int) -> str | None:  # fmt: skip
    """A keyed table's net change, in the state's types, written: as a first state (its deleted
    keys left out: one append, no MERGE), or merged into the state (``_merge_into``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    target, columns = plan.target, plan.columns
    try:
        source = net.cast(wanted(net, plan.state, columns))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        return f"types the state holds differently ({exc})"
    uri = lake.paths.state(name)
    fault("merge_created")
    if target is None:
        rows = source.filter(pc.invert(source.column(DELETE_COLUMN))).select(columns)
        _create(lake, name, rows, end)
    else:
        _merge_into(lake, uri, end, plan, target, source, values)
    fault("merge_committed")
    log.info("state of %s %s up to %s without a JVM (%d changes, %d keys)", name,
             "written" if target is None else "merged", end, changes,
             net.num_rows)  # fmt: skip
    return None


def _merge_into(lake: Lake, uri: str, end: LSN, plan: _Plan, target: Any, source: pa.Table,
                values: list[str]) -> None:  # fmt: skip
    """The MERGE into an existing state with the app transaction ``(lake.app, end)``, right after
    the writer lock is proven; made durable before this returns (delta-rs does not fsync, and the
    slot may move once the merge is known); the position recorded even if it committed nothing."""
    from deltalake import CommitProperties, Transaction

    before = int(target.version())
    commit = CommitProperties(app_transactions=[Transaction(lake.app, int(end))])
    lake.check_writer()
    _merge(target, source, plan.keys, values, commit)
    if is_local(uri):
        durability.make_log_durable(uri, after=before)
    if delta.txn_version(uri, lake.app) != int(end):
        # Nothing to change (every key's net effect cancelled out: an insert then a delete):
        # delta-rs then commits nothing, yet the state must say it includes the batch, or
        # it looks behind for ever (merged again each run, cuts held back).
        _record_position(uri, lake.app, plan.state, end, plan.have)


def _record_position(uri: str, app: str, state: pa.Schema, end: LSN, have: int | None) -> None:
    """A version of the state with no files that says it includes the changes up to ``end``
    (nothing to write), a compare-and-set on ``have``, the version the batch was read against."""
    delta.commit_files(uri, state, [], app=app, version=int(end), expected=have)


def _append(lake: Lake, name: str, end: LSN, target: Any | None, in_range: InRange,
            plan: _Plan) -> str | None:  # fmt: skip
    """A keyless table's state is a multiset of rows: a batch of inserts alone adds one copy of
    each, so it is appended as it is, batch by batch into new files (``merge.state_files``),
    and committed once: a compare-and-set on the state's transaction version (or the state's
    creation). Without a replica identity only inserts and truncates are published; under
    REPLICA IDENTITY FULL updates and deletes are too. Anything but inserts goes to Spark (a
    ``TRUNCATE`` rewrites the state, an update or delete removes copies by counting them),
    which the caller checked from the operations in range."""
    fault("merge_created")
    with StateTarget(lake, name, plan.state, target, end) as files:
        for batch in in_range.batches(plan.columns):
            try:
                rows = batch.cast(plan.state)
            except (ValueError, NotImplementedError) as exc:  # Arrow's errors are both
                raise DeclinedError(f"types the state holds differently ({exc})") from None
            files.write(rows)
        appended = files.commit()
    fault("merge_committed")
    log.info("state of %s appended up to %s without a JVM (%d inserts)", name, end, appended)
    return None


def _not_appendable(full: bool, operations: set[str]) -> str:
    """Why a keyless table's batch goes to Spark: a ``TRUNCATE`` rewrites the state, an update
    or delete under FULL identity removes copies, which Spark's multiset merge counts."""
    if not full:
        return "a table without a key whose batch is not only inserts (a TRUNCATE)"
    if TRUNCATE in operations:
        return "REPLICA IDENTITY FULL, a TRUNCATE in the batch (Spark rewrites the state)"
    return "REPLICA IDENTITY FULL, updates or deletes (Spark's multiset merge counts copies)"


def _create(lake: Lake, name: str, rows: pa.Table, end: LSN) -> None:
    """A table's first state: its files, then version 0 holding them with the app transaction,
    put only if no table appeared since it was found missing (else a lost race). Configured as
    Spark's path creates a state (``Lake.state_config``: deletion vectors on unless the lake
    says otherwise, so later merges by Spark write vectors instead of rewriting); created by
    ``delta.create_table``, whose protocol needs no more than that."""
    with StateTarget(lake, name, rows.schema, None, end) as files:
        files.write(rows)
        files.commit()


def _text(metadata: dict[bytes, bytes] | None) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (metadata or {}).items()}


def _merge(target: Any, source: pa.Table, keys: Sequence[str], values: Sequence[str],
           commit: Any) -> None:  # fmt: skip
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    update = {
        quote(c): f"CASE WHEN s.{sent_column(i)} THEN s.{quote(c)} ELSE t.{quote(c)} END"
        for i, c in enumerate(values)
    }
    insert = {quote(c): f"s.{quote(c)}" for c in [*keys, *values]}
    merger = target.merge(source, on, source_alias="s", target_alias="t",
                          commit_properties=commit)  # fmt: skip
    merger = merger.when_matched_delete(predicate=f"s.{DELETE_COLUMN}")
    if values:
        merger = merger.when_matched_update(updates=update, predicate=f"NOT s.{DELETE_COLUMN}")
    merger.when_not_matched_insert(updates=insert, predicate=f"NOT s.{DELETE_COLUMN}").execute()
