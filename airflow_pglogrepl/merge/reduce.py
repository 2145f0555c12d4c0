"""Reduce a batch of a table's changelog to its net effect on the state: what a MERGE applies.

``net_changes`` is a pure DataFrame function, so one distributed Spark plan computes it and
nothing is collected to the driver, and the caller (``materialize``) decides how it reaches the
Delta table: a ``MERGE INTO`` that touches only the rows the batch changed, an append, or (after
a TRUNCATE) an overwrite, each one atomic version.

How a keyed table's batch is reduced, and why this way:

* A ``TRUNCATE`` is a barrier. Only the last one in the batch matters: it empties the table and
  every change before it, and later changes apply to the empty table. The new state is then
  exactly what the changes after it build, written as one overwrite.
* Each change becomes an *event* at one key. An update that changes the key becomes two events at
  the same commit position: the row *exits* its old key and *arrives* at its new one.
* Per key, in commit order, events form *segments*: one row version's stay at that key. A segment
  starts with an insert or an arrival (or, before any of those, is the state's row at that key)
  and ends with a delete, an exit or the next start.
* A *lineage* is one row's life across keys: segments chained by key changes. Unchanged TOAST
  values (``_unchanged``) must come from the row's latest earlier version, which may sit under
  another key several key changes back, so values are resolved per lineage. Chaining segments is
  pointer jumping over the (usually tiny) set of key changes: O(log chain length) small joins,
  run only when the batch has key changes at all. Events, segments and lineages are built in
  ``merge.lineage``; the net change below is built from their outcome here.
* Per lineage, each column's value is the latest one actually sent (``max_by`` over commit
  order, skipping unchanged markers). The lineage's last event says whether the row still
  exists and under which key.
* The net change is then one source row per touched key: an *upsert* at each key where a live
  lineage ends (columns never sent are kept from the target row by the MERGE itself, or, for a
  row that moved to another key, read from the state row it moved from), and a *delete* at each
  key whose state row left and was not replaced. The MERGE matches by key, so only the files
  holding touched keys change (with deletion vectors, not even those are rewritten).

``REPLICA IDENTITY FULL`` tables have no key, and identical rows may repeat, so their state is a
multiset: every change adds or removes one copy of a whole row. The net change counts copies per
distinct row; a row whose count fell is deleted (all copies) and re-inserted as many times as
remain, a row whose count rose gets the extra copies inserted. The old row PostgreSQL sends for
an update under FULL is complete, so unchanged TOAST values are taken from it directly.

Data that contradicts the changelog contract (an unchanged TOAST value with no earlier version of
its row anywhere, an update without its old row under FULL identity) fails the Spark job with a
clear message instead of silently writing NULL: a wrong current state is worse than a stopped one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    DELETE,
    INSERT,
    OLD,
    OP,
    SEQ,
    TRUNCATE,
    UNCHANGED,
    UPDATE,
)
from airflow_pglogrepl.merge.lineage import (
    INTERNAL,
    LAST,
    ROOT_KEY,
    ROOT_START,
    alive,
    column,
    is_unchanged,
    lineages,
    value_column,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Copies of one row under REPLICA IDENTITY FULL are expanded this many at a time.
_CHUNK = 4096

# Internal columns of the steps below (named under ``lineage.INTERNAL``, as no table column is).
_JOIN, _FINAL, _SKEY = f"{INTERNAL}join", f"{INTERNAL}final", f"{INTERNAL}skey"
_PRESENT, _DELTA, _ROW = f"{INTERNAL}present", f"{INTERNAL}delta", f"{INTERNAL}row"
_COUNT, _OLDCOUNT = f"{INTERNAL}count", f"{INTERNAL}oldcount"
# Columns of the MERGE source (``NetChanges.rows`` in the "upsert" and "multiset" modes).
FILL = f"{INTERNAL}fill"  # "target": keep the target's value where none was sent; "none": all sent
DELETE_ROW = f"{INTERNAL}delete"  # this source row deletes the target row(s) it matches
MATCH = f"{INTERNAL}match"  # multiset: this source row matches (and deletes) every copy of its row

Mode = Literal["upsert", "multiset", "append", "replace"]


def key_column(j: int) -> str:
    """Source column of the ``j``-th key column (upsert mode)."""
    return f"{INTERNAL}k{j}"


def row_column(i: int) -> str:
    """Source column of the ``i``-th column (multiset mode)."""
    return f"{INTERNAL}c{i}"


def _state_value_column(i: int) -> str:
    return f"{INTERNAL}s{i}"


@dataclass(frozen=True)
class NetChanges:
    """What a batch does to a table, in one of four shapes.

    ``replace``: ``rows`` (the table's columns) is the whole new state (the batch truncated it).
    ``append``: ``rows`` (the table's columns) are new rows (a table without replica identity).
    ``upsert``: ``rows`` has ``key_column(j)``, ``value_column(i)``, ``FILL``, ``DELETE_ROW``; at
    most one row per key. ``multiset``: ``rows`` has ``row_column(i)`` and ``MATCH``.
    """

    mode: Mode
    rows: DataFrame
    keys: list[str]
    columns: list[str]

    @property
    def values(self) -> list[str]:
        """The non-key columns, in table order (``value_column(i)`` is the ``i``-th of these)."""
        return [c for c in self.columns if c not in self.keys]


def net_changes(
    changes: DataFrame,
    target: DataFrame | None,
    *,
    key: Sequence[str],
    columns: Sequence[str],
    full_identity: bool = False,
    table: str | None = None,
) -> NetChanges:
    """The net effect of ``changes`` on ``target`` (the table's current state; None: empty).

    ``changes`` follows the changelog contract (``airflow_pglogrepl.changelog.columns``); it may
    hold any number of transactions, in any physical order: commit order is ``(_commit_lsn, _seq)``.
    ``key`` is the replica identity's columns; ``full_identity`` means REPLICA IDENTITY FULL
    (``key`` is then ignored: the whole row is the identity). ``table`` only names the table in
    errors. ``target`` is only read: for the rows that moved to another key and for copy
    counts under FULL identity.

    Lazy, except for what decides the plan: whether the batch holds a TRUNCATE, key changes
    (keyed tables) or updates and deletes (tables without identity). A table without a replica
    identity can only take inserts and truncates: a ``ValueError`` is raised at once if the batch
    updates or deletes rows of one.
    """
    from pyspark.sql import functions as sf

    cols, keys = list(columns), list(key)
    name = f"table {table}" if table else "the table"
    _check_schema(target, changes, keys, cols, full_identity)
    if not full_identity and not keys:
        _refuse_updates_without_identity(changes, name)
    truncated = not changes.filter(sf.col(OP) == TRUNCATE).isEmpty()
    kept = _after_last_truncate(changes) if truncated else changes
    state = None if truncated else target
    if full_identity:
        return _multiset(state, kept, cols, truncated)
    if keys:
        return _keyed(state, kept, keys, cols, truncated)
    inserts = kept.filter(sf.col(OP) == INSERT).select(*(column(c).alias(c) for c in cols))
    return NetChanges("replace" if truncated else "append", inserts, [], cols)


# -- shared steps ------------------------------------------------------------------------------


def _check_schema(
    previous: DataFrame | None,
    changes: DataFrame,
    keys: list[str],
    cols: list[str],
    full_identity: bool,
) -> None:
    """Fail before any Spark job on arguments that cannot describe one table's changelog."""
    if not cols or len(set(cols)) != len(cols):
        raise ValueError(f"columns must be non-empty and distinct, got {cols!r}")
    if not full_identity and (len(set(keys)) != len(keys) or not set(keys) <= set(cols)):
        raise ValueError(f"key {keys!r} must be distinct columns among {cols!r}")
    need = [*cols, OP, COMMIT_LSN, SEQ, UNCHANGED, OLD]
    missing = [c for c in need if c not in changes.columns]
    if missing:
        raise ValueError(f"changes lack changelog columns {missing!r}")
    if previous is not None:
        absent = [c for c in cols if c not in previous.columns]
        if absent:
            raise ValueError(f"previous state lacks columns {absent!r}")


def _refuse_updates_without_identity(changes: DataFrame, name: str) -> None:
    """Without a replica identity no row can be told apart: an update or delete is unmergeable."""
    from pyspark.sql import functions as sf

    if not changes.filter(sf.col(OP).isin(UPDATE, DELETE)).isEmpty():
        raise ValueError(
            f"{name} has no replica identity: UPDATE/DELETE cannot be merged; "
            "set REPLICA IDENTITY (a primary key, USING INDEX or FULL) on the table"
        )


def _after_last_truncate(changes: DataFrame) -> DataFrame:
    """The changes after the batch's last TRUNCATE (found by an aggregate, not a window, so no
    single task sees the whole batch)."""
    from pyspark.sql import functions as sf

    position = sf.struct(sf.col(COMMIT_LSN).alias("l"), sf.col(SEQ).alias("s"))
    barrier = changes.filter(sf.col(OP) == TRUNCATE).select(sf.max(position)).scalar()
    return changes.filter((sf.col(OP) != TRUNCATE) & (position > barrier))


# -- REPLICA IDENTITY FULL: a multiset of whole rows ----------------------------------------------


def _multiset(
    state: DataFrame | None, changes: DataFrame, cols: list[str], truncated: bool
) -> NetChanges:
    """Count copies per distinct row: +1 per insert, -1 per delete, -1/+1 per update.

    Counting instead of matching rows one by one is what keeps identical rows from being lost or
    doubled, and needs no ordering: within a batch after its last truncate, only how many copies
    were added and removed decides how many remain.
    """
    from pyspark.sql import functions as sf

    def row(values: Callable[[str], Column]) -> Column:
        return sf.struct(*(values(c).alias(f"c{i}") for i, c in enumerate(cols)))

    def entry(delta: int, values: Column) -> Column:
        return sf.struct(sf.lit(delta).alias("d"), values.alias("r"))

    old = sf.col(OLD)
    current = row(column)
    before = row(old.getField)
    after = row(lambda c: sf.when(is_unchanged(c), old.getField(c)).otherwise(column(c)))
    op = sf.col(OP)
    entries = (
        sf.when(op == INSERT, sf.array(entry(1, current)))
        .when(op == DELETE, sf.array(entry(-1, current)))
        .when(op == UPDATE, sf.array(entry(-1, before), entry(1, after)))
    )
    # Under FULL identity PostgreSQL always sends the old row with an update; without it the
    # row being replaced cannot be identified.
    checked = sf.when(
        (op == UPDATE) & old.isNull(),
        sf.raise_error("UPDATE without its old row under REPLICA IDENTITY FULL cannot be merged"),
    ).otherwise(entries)
    events = changes.select(sf.explode(checked).alias("e")).select(
        sf.col("e.d").alias(_DELTA), sf.col("e.r").alias(_ROW)
    )
    counts = events.groupBy(_ROW).agg(sf.sum(_DELTA).alias(_DELTA)).filter(sf.col(_DELTA) != 0)
    if truncated or state is None:
        final = counts.select(_ROW, sf.col(_DELTA).alias(_COUNT)).filter(sf.col(_COUNT) > 0)
        expanded = _copies(final).select(
            *(sf.col(_ROW).getField(f"c{i}").alias(c) for i, c in enumerate(cols))
        )
        return NetChanges("replace" if truncated else "append", expanded, [], cols)
    # How many copies the target holds of each touched row: a read of the target, joined on
    # whole rows (NULL equals NULL), grouped; rows the batch did not touch are not counted.
    held = (
        state.select(row(column).alias(_SKEY))
        .join(counts.select(sf.col(_ROW).alias(_JOIN)), sf.col(_SKEY).eqNullSafe(sf.col(_JOIN)))
        .groupBy(_JOIN)
        .agg(sf.count(sf.lit(1)).alias(_OLDCOUNT))
    )
    both = counts.join(held, sf.col(_ROW).eqNullSafe(sf.col(_JOIN)), "left").select(
        _ROW,
        sf.coalesce(sf.col(_OLDCOUNT), sf.lit(0)).alias(_OLDCOUNT),
        sf.greatest(sf.coalesce(sf.col(_OLDCOUNT), sf.lit(0)) + sf.col(_DELTA), sf.lit(0)).alias(
            _COUNT
        ),
    )
    fell = (sf.col(_COUNT) < sf.col(_OLDCOUNT)) & (sf.col(_OLDCOUNT) > 0)
    # Where the count fell: delete every copy (one matching row) and insert what remains; where
    # it rose: insert only the extra copies.
    deletes = both.filter(fell).select(_ROW, sf.lit(True).alias(MATCH))
    inserts = both.select(
        _ROW,
        sf.when(fell, sf.col(_COUNT))
        .otherwise(sf.col(_COUNT) - sf.col(_OLDCOUNT))
        .cast("long")
        .alias(_COUNT),
    ).filter(sf.col(_COUNT) > 0)
    source = deletes.unionByName(_copies(inserts).select(_ROW, sf.lit(False).alias(MATCH)))
    rows = source.select(
        *(sf.col(_ROW).getField(f"c{i}").alias(row_column(i)) for i in range(len(cols))), MATCH
    )
    return NetChanges("multiset", rows, [], cols)


def _copies(counts: DataFrame) -> DataFrame:
    """``_ROW`` repeated ``_COUNT`` times.

    Expands n copies without building an n-element array of rows (or of n numbers): first the
    chunk numbers, then at most _CHUNK numbers per chunk, each output row referencing the one
    stored row. Memory stays bounded however many identical rows a table holds.
    """
    from pyspark.sql import functions as sf

    n = sf.col(_COUNT)
    first = sf.lit(0).cast("long")
    chunks = counts.select(
        sf.col(_ROW),
        n,
        sf.explode(sf.sequence(first, sf.floor((n - 1) / _CHUNK).cast("long"))).alias(_DELTA),
    )
    rest = n - sf.col(_DELTA) * _CHUNK
    return chunks.select(
        sf.col(_ROW),
        sf.explode(
            sf.sequence(sf.lit(1).cast("long"), sf.least(sf.lit(_CHUNK).cast("long"), rest))
        ),
    ).select(_ROW)


# -- keyed tables ---------------------------------------------------------------------------------


def _keyed(
    state: DataFrame | None,
    changes: DataFrame,
    keys: list[str],
    cols: list[str],
    truncated: bool,
) -> NetChanges:
    """Reduce by replica identity key; see the module docstring for the plan."""
    values = [c for c in cols if c not in keys]
    outcome, has_moves = lineages(changes, keys, values)
    if truncated or state is None:
        return NetChanges(
            "replace" if truncated else "upsert",
            _rebuilt(outcome, keys, cols, values)
            if truncated
            else _upserts(outcome, None, keys, cols, values, moved=False),
            keys,
            cols,
        )
    return NetChanges(
        "upsert", _upserts(outcome, state, keys, cols, values, moved=has_moves), keys, cols
    )


def _unsent_error(column: str) -> Column:
    from pyspark.sql import functions as sf

    return sf.raise_error(
        f"unchanged TOAST value of column {column!r} has no earlier version to keep: an UPDATE "
        "reached a row that is neither in the previous state nor inserted earlier in the batch"
    )


def _rebuilt(outcome: DataFrame, keys: list[str], cols: list[str], values: list[str]) -> DataFrame:
    """The whole state after a TRUNCATE: every live lineage, all of its values sent."""
    from pyspark.sql import functions as sf

    final = sf.col(LAST).getField("key")
    out = []
    for c in cols:
        if c in keys:
            out.append(final.getField(f"k{keys.index(c)}").alias(c))
        else:
            sent = sf.col(value_column(values.index(c)))
            out.append(sf.when(sent.isNotNull(), sent.getField("v")).otherwise(
                _unsent_error(c)).alias(c))  # fmt: skip
    return outcome.filter(alive()).select(*out)


def _upserts(
    outcome: DataFrame,
    state: DataFrame | None,
    keys: list[str],
    cols: list[str],
    values: list[str],
    *,
    moved: bool,
) -> DataFrame:
    """One MERGE source row per touched key: an upsert where a live lineage ends, else a delete
    where a state row left.

    A lineage that began with a state row (``ROOT_START`` NULL) and ends alive at the same key
    keeps the target's values for columns it never sent (``FILL`` "target", done by the MERGE).
    One that moved to another key takes them from the state row it began at, read here (only
    when the batch moved some key at all). The state row a lineage left is deleted unless a live
    lineage ends at that key (its upsert replaces the row).
    """
    from pyspark.sql import functions as sf

    final = sf.col(LAST).getField("key")
    from_state = sf.col(ROOT_START).isNull()
    live = outcome.filter(alive()).select(
        final.alias(_FINAL),
        sf.col(ROOT_KEY),
        from_state.alias(_PRESENT),
        *(sf.col(value_column(i)) for i in range(len(values))),
    )
    fill = sf.when(sf.col(_PRESENT) & (sf.col(ROOT_KEY) == sf.col(_FINAL)), sf.lit("target"))
    if moved and state is not None:
        previous = state.select(
            sf.struct(*(column(k).alias(f"k{j}") for j, k in enumerate(keys))).alias(_SKEY),
            *(column(c).alias(_state_value_column(i)) for i, c in enumerate(values)),
        )
        moving = sf.col(_PRESENT) & (sf.col(ROOT_KEY) != sf.col(_FINAL))
        live = live.join(previous, moving & (sf.col(ROOT_KEY) == sf.col(_SKEY)), "left").select(
            _FINAL,
            ROOT_KEY,
            _PRESENT,
            *(
                sf.when(
                    sf.col(value_column(i)).isNull() & sf.col(_SKEY).isNotNull(),
                    sf.struct(sf.col(_state_value_column(i)).alias("v")),
                )
                .otherwise(sf.col(value_column(i)))
                .alias(value_column(i))
                for i in range(len(values))
            ),
        )
    upserts = live.select(
        *(final_key.alias(key_column(j)) for j, final_key in _key_fields(_FINAL, keys)),
        *(sf.col(value_column(i)) for i in range(len(values))),
        fill.otherwise(sf.lit("none")).alias(FILL),
        sf.lit(False).alias(DELETE_ROW),
    )
    if state is None:
        return upserts
    left = outcome.filter(sf.col(ROOT_START).isNull()).select(sf.col(ROOT_KEY).alias(_JOIN))
    replaced = upserts.select(sf.struct(*(sf.col(key_column(j)).alias(f"k{j}")
                                          for j in range(len(keys)))).alias(_JOIN))  # fmt: skip
    types = {f.name: f.dataType for f in upserts.schema.fields}
    deletes = left.join(replaced, _JOIN, "left_anti").select(
        *(sf.col(_JOIN).getField(f"k{j}").alias(key_column(j)) for j in range(len(keys))),
        *(
            sf.lit(None).cast(types[value_column(i)]).alias(value_column(i))
            for i in range(len(values))
        ),
        sf.lit("none").alias(FILL),
        sf.lit(True).alias(DELETE_ROW),
    )
    return upserts.unionByName(deletes)


def _key_fields(struct_column: str, keys: list[str]) -> list[tuple[int, Column]]:
    from pyspark.sql import functions as sf

    return [(j, sf.col(struct_column).getField(f"k{j}")) for j in range(len(keys))]
