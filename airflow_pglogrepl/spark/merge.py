"""Merge a table's committed changelog onto its previous state: the materialized current state.

``merge_state`` is a pure DataFrame-to-DataFrame function so that the caller decides where data
is read from and written to, and so that the whole merge is one distributed Spark plan: nothing
is collected to the driver, so peak driver memory does not grow with the backlog.

How a keyed table is merged, and why this way:

* A ``TRUNCATE`` is a barrier. Only the last one in the batch matters: it empties the previous
  state and every change before it, and later changes apply to the empty table. It is found with
  an aggregate (a scalar subquery), not a window, so no single task sees the whole table.
* Each change becomes an *event* at one key. An update that changes the key becomes two events at
  the same commit position: the row *exits* its old key and *arrives* at its new one.
* Per key, in commit order, events form *segments*: one row version's stay at that key. A segment
  starts with an insert or an arrival (or, before any of those, is the previous state's row at
  that key) and ends with a delete, an exit or the next start.
* A *lineage* is one row's life across keys: segments chained by key changes. Unchanged TOAST
  values (``_unchanged``) must come from the row's latest earlier version, which may sit under
  another key several key changes back, so values are resolved per lineage. Chaining segments is
  pointer jumping over the (usually tiny) set of key changes: O(log chain length) small joins,
  run only when the batch has key changes at all.
* Per lineage, each column's value is the latest one actually sent (``max_by`` over commit
  order, skipping unchanged markers); columns never sent in the batch come from the previous
  state's row the lineage started from. The lineage's last event says whether the row still
  exists and under which key.
* One full outer join with the previous state then replaces every key the batch touched and
  keeps every other row as it was: the previous state is shuffled once.

``REPLICA IDENTITY FULL`` tables have no key, and identical rows may repeat, so their state is a
multiset: every change adds or removes one copy of a whole row and the merge sums copies per
distinct row. The old row PostgreSQL sends for an update under FULL is complete, so unchanged
TOAST values are taken from it directly.

Data that contradicts the changelog contract (an unchanged TOAST value with no earlier version of
its row anywhere, an update without its old row under FULL identity) fails the Spark job with a
clear message instead of silently writing NULL: a wrong current state is worse than a stopped one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_pglogrepl.spark.changelog import (
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

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

# Event kinds of a key-changing update, besides the changelog's own I/U/D.
_ARRIVE = "A"  # the row now lives under this (new) key
_EXIT = "X"  # the row left this (old) key

# Copies of one row under REPLICA IDENTITY FULL are expanded this many at a time.
_CHUNK = 4096

# Internal columns: every intermediate DataFrame holds only these, so no table column name (they
# are arbitrary PostgreSQL identifiers) can collide with them or need quoting past the first step.
_P = "__pglr_"
_KEY, _KIND, _LSN, _SEQ, _SUB = f"{_P}key", f"{_P}kind", f"{_P}lsn", f"{_P}seq", f"{_P}sub"
_NEW, _OLDKEY, _MOVES, _DEST = f"{_P}new", f"{_P}oldkey", f"{_P}moves", f"{_P}dest"
_START, _LATEST, _FIRST, _MARKER = f"{_P}start", f"{_P}latest", f"{_P}first", f"{_P}marker"
_CHILD, _PARENT, _JUMPED = f"{_P}child", f"{_P}parent", f"{_P}jumped"
_ROOTKEY, _ROOTSTART = f"{_P}rootkey", f"{_P}rootstart"
_LAST, _ALIVE, _JOIN, _FINAL = f"{_P}last", f"{_P}alive", f"{_P}join", f"{_P}final"
_SKEY, _PRESENT, _DELTA, _ROW, _COUNT = (
    f"{_P}skey",
    f"{_P}present",
    f"{_P}delta",
    f"{_P}row",
    f"{_P}count",
)


def _out(i: int) -> str:
    """Internal name of the table's ``i``-th column in the merged result."""
    return f"{_P}c{i}"


def _val(i: int) -> str:
    """Internal name of the ``i``-th non-key column's value as sent (NULL: not sent)."""
    return f"{_P}v{i}"


def _state_val(i: int) -> str:
    """Internal name of the ``i``-th non-key column in the previous state."""
    return f"{_P}s{i}"


def merge_state(
    previous: DataFrame | None,
    changes: DataFrame,
    *,
    key: Sequence[str],
    columns: Sequence[str],
    full_identity: bool = False,
    table: str | None = None,
) -> DataFrame:
    """The table's new current state: ``previous`` with the committed ``changes`` applied.

    ``changes`` follows the changelog contract (``airflow_pglogrepl.spark.changelog``); it may hold
    any number of transactions, in any physical order: commit order is ``(_commit_lsn, _seq)``.
    ``previous`` is the state before the first of them (``None``: the table was empty). ``key``
    is the replica identity's columns; ``full_identity`` means REPLICA IDENTITY FULL (``key`` is
    then ignored: the whole row is the identity). ``table`` only names the table in errors.

    The result has exactly ``columns``, in that order, with the types ``changes`` has for them.
    It is lazy: the caller's write runs the merge. This call itself only runs what decides the
    plan: a narrow scan of the changes for key changes (keyed tables) or for updates and deletes
    (tables without identity), and, when some key did change, the few rounds that chain them.
    A table without a replica identity can only take inserts and truncates: a ``ValueError`` is
    raised at once if the batch updates or deletes rows of one.
    """
    cols, keys = list(columns), list(key)
    name = f"table {table}" if table else "the table"
    _check_schema(previous, changes, keys, cols, full_identity)
    types: dict[str, DataType] = {f.name: f.dataType for f in changes.schema.fields}
    if not full_identity and not keys:
        _refuse_updates_without_identity(changes, name)

    kept, state = _after_last_truncate(previous, changes, cols, types)
    if full_identity:
        merged = _merge_multiset(state, kept, cols)
    elif keys:
        merged = _merge_keyed(state, kept, changes, keys, cols)
    else:
        merged = _merge_inserts(state, kept, cols)

    from pyspark.sql import functions as sf

    return merged.select(*(sf.col(_out(i)).cast(types[c]).alias(c) for i, c in enumerate(cols)))


# -- shared steps ------------------------------------------------------------------------------


def _col(name: str) -> Column:
    """A table column by its exact name (PostgreSQL names may contain dots or backticks)."""
    from pyspark.sql import functions as sf

    return sf.col("`" + name.replace("`", "``") + "`")


def _is_unchanged(column: str) -> Column:
    """True where the row's ``column`` is an unchanged TOAST value, not a value (or real NULL)."""
    from pyspark.sql import functions as sf

    return sf.coalesce(sf.array_contains(sf.col(UNCHANGED), column), sf.lit(False))


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


def _after_last_truncate(
    previous: DataFrame | None,
    changes: DataFrame,
    cols: list[str],
    types: dict[str, DataType],
) -> tuple[DataFrame, DataFrame | None]:
    """Changes after the batch's last TRUNCATE, and the previous state unless one exists.

    The state comes back with internal column names and the changelog's types, so that it lines
    up with what the changes carry.
    """
    from pyspark.sql import functions as sf

    position = sf.struct(sf.col(COMMIT_LSN).alias("l"), sf.col(SEQ).alias("s"))
    barrier = changes.filter(sf.col(OP) == TRUNCATE).select(sf.max(position)).scalar()
    kept = changes.filter((sf.col(OP) != TRUNCATE) & (barrier.isNull() | (position > barrier)))
    if previous is None:
        return kept, None
    state = previous.filter(barrier.isNull()).select(
        *(_col(c).cast(types[c]).alias(_out(i)) for i, c in enumerate(cols))
    )
    return kept, state


# -- tables without a replica identity ------------------------------------------------------------


def _merge_inserts(state: DataFrame | None, changes: DataFrame, cols: list[str]) -> DataFrame:
    """No identity: rows are only ever added (or truncated away), duplicates included."""
    from pyspark.sql import functions as sf

    inserts = changes.filter(sf.col(OP) == INSERT).select(
        *(_col(c).alias(_out(i)) for i, c in enumerate(cols))
    )
    return inserts if state is None else state.unionByName(inserts)


# -- REPLICA IDENTITY FULL: a multiset of whole rows ----------------------------------------------


def _merge_multiset(state: DataFrame | None, changes: DataFrame, cols: list[str]) -> DataFrame:
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
    current = row(_col)
    before = row(old.getField)
    after = row(lambda c: sf.when(_is_unchanged(c), old.getField(c)).otherwise(_col(c)))
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
    if state is not None:
        base = state.select(
            sf.lit(1).alias(_DELTA),
            sf.struct(*(sf.col(_out(i)).alias(f"c{i}") for i in range(len(cols)))).alias(_ROW),
        )
        events = base.unionByName(events)
    counts = events.groupBy(_ROW).agg(sf.sum(_DELTA).alias(_COUNT)).filter(sf.col(_COUNT) > 0)
    # Expand n copies without building an n-element array of rows (or of n numbers): first the
    # chunk numbers, then at most _CHUNK numbers per chunk, each output row referencing the one
    # stored row. Memory stays bounded however many identical rows a table holds.
    n = sf.col(_COUNT)
    first = sf.lit(0).cast("long")
    chunks = counts.select(
        sf.col(_ROW),
        n,
        sf.explode(sf.sequence(first, sf.floor((n - 1) / _CHUNK).cast("long"))).alias(_DELTA),
    )
    rest = n - sf.col(_DELTA) * _CHUNK
    copies = chunks.select(
        sf.col(_ROW),
        sf.explode(
            sf.sequence(sf.lit(1).cast("long"), sf.least(sf.lit(_CHUNK).cast("long"), rest))
        ),
    )
    return copies.select(*(sf.col(_ROW).getField(f"c{i}").alias(_out(i)) for i in range(len(cols))))


# -- keyed tables ---------------------------------------------------------------------------------


def _merge_keyed(
    state: DataFrame | None,
    kept: DataFrame,
    changes: DataFrame,
    keys: list[str],
    cols: list[str],
) -> DataFrame:
    """Merge by replica identity key; see the module docstring for the plan.

    ``kept`` are the changes after the last truncate, ``changes`` all of them: whether any key
    changes at all is asked of the raw changes, a narrow scan without the truncate subquery.
    """
    from pyspark.sql import functions as sf

    values = [c for c in cols if c not in keys]
    has_moves = not changes.filter(_key_change(keys)[2]).isEmpty()
    located = _segments(_keyed_events(kept, keys, values))
    if has_moves:
        start = sf.struct(sf.col(_LSN).alias("l"), sf.col(_SEQ).alias("s"))
        links = located.filter(sf.col(_KIND) == _EXIT).select(
            sf.struct(sf.col(_DEST).alias("key"), start.alias("start")).alias(_CHILD),
            sf.struct(sf.col(_KEY).alias("key"), sf.col(_START).alias("start")).alias(_PARENT),
        )
        segment = sf.struct(sf.col(_KEY).alias("key"), sf.col(_START).alias("start"))
        linked = sf.col(_CHILD).isNotNull()
        located = located.join(_roots(links), segment == sf.col(_CHILD), "left").select(
            "*",
            sf.when(linked, sf.col(_PARENT).getField("key"))
            .otherwise(sf.col(_KEY))
            .alias(_ROOTKEY),
            sf.when(linked, sf.col(_PARENT).getField("start"))
            .otherwise(sf.col(_START))
            .alias(_ROOTSTART),
        )
    outcome = _per_lineage(located, len(values), moved=has_moves)
    return _apply_to_state(state, outcome, keys, cols, values)


def _key_change(keys: list[str]) -> tuple[Column, Column, Column]:
    """The new key, the old key, and whether this change is an update that changes the key.

    A key column can itself be an unchanged TOAST value; PostgreSQL then sends the old key, and
    the new key's value is the old one.
    """
    from pyspark.sql import functions as sf

    old = sf.col(OLD)
    new_key = sf.struct(
        *(
            sf.when(_is_unchanged(k) & old.isNotNull(), old.getField(k))
            .otherwise(_col(k))
            .alias(f"k{j}")
            for j, k in enumerate(keys)
        )
    )
    old_key = sf.struct(*(old.getField(k).alias(f"k{j}") for j, k in enumerate(keys)))
    moves = (sf.col(OP) == UPDATE) & old.isNotNull() & ~old_key.eqNullSafe(new_key)
    return new_key, old_key, moves


def _keyed_events(changes: DataFrame, keys: list[str], values: list[str]) -> DataFrame:
    """One event per change, two per key-changing update (exit the old key, arrive at the new).

    ``_KEY`` is the key the event happens at, ``_DEST`` (exits only) the key the row moves to,
    and ``_val(i)`` the ``i``-th non-key column as ``struct(v)`` when sent, NULL when the change
    did not send it (unchanged TOAST, or a delete/exit): a real NULL is ``struct(NULL)``.
    """
    from pyspark.sql import functions as sf

    new_key, old_key, moves = _key_change(keys)
    rows = changes.select(
        sf.col(OP).alias(_KIND),
        sf.col(COMMIT_LSN).cast("long").alias(_LSN),
        sf.col(SEQ).cast("long").alias(_SEQ),
        new_key.alias(_NEW),
        old_key.alias(_OLDKEY),
        moves.alias(_MOVES),
        *(
            sf.when(~_is_unchanged(c), sf.struct(_col(c).alias("v"))).alias(_val(i))
            for i, c in enumerate(values)
        ),
        sf.explode(
            sf.when(moves, sf.array(sf.lit(0), sf.lit(1))).otherwise(sf.array(sf.lit(1)))
        ).alias(_SUB),
    )
    exiting = sf.col(_SUB) == 0
    kind = (
        sf.when(exiting, sf.lit(_EXIT))
        .when(sf.col(_MOVES), sf.lit(_ARRIVE))
        .otherwise(sf.col(_KIND))
    )
    carries_values = kind.isin(INSERT, UPDATE, _ARRIVE)
    return rows.select(
        sf.when(exiting, sf.col(_OLDKEY)).otherwise(sf.col(_NEW)).alias(_KEY),
        kind.alias(_KIND),
        sf.col(_LSN),
        sf.col(_SEQ),
        sf.col(_SUB),
        sf.when(exiting, sf.col(_NEW)).alias(_DEST),
        *(sf.when(carries_values, sf.col(_val(i))).alias(_val(i)) for i in range(len(values))),
    )


def _segments(events: DataFrame) -> DataFrame:
    """Tag each event with its segment at its key, and whether that segment is the key's last.

    A segment is identified by ``(key, start)``: ``_START`` is the commit position of the insert
    or arrival that began it, NULL for the previous state's row at that key. ``_FIRST`` marks
    each key's first event in the batch.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    by_key = Window.partitionBy(_KEY).orderBy(_LSN, _SEQ, _SUB)
    starts = sf.when(
        sf.col(_KIND).isin(INSERT, _ARRIVE),
        sf.struct(sf.col(_LSN).alias("l"), sf.col(_SEQ).alias("s")),
    )
    so_far = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = by_key.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    start = sf.last(starts, ignorenulls=True).over(so_far)
    last_start = sf.last(starts, ignorenulls=True).over(whole)
    return events.select(
        "*",
        start.alias(_START),
        start.eqNullSafe(last_start).alias(_LATEST),
        (sf.row_number().over(by_key) == 1).alias(_FIRST),
    )


def _roots(links: DataFrame) -> DataFrame:
    """For each segment a key change began (``_CHILD``), the segment its lineage began with.

    Pointer jumping: each round replaces every segment's parent by its grandparent and notes
    whether that is still a child, so chains of length n resolve in about log2(n) rounds (one
    round for chains of one or two key changes, the usual case). Parents always start before
    their children, so there are no cycles and the loop ends. Each round is checkpointed to keep
    plans small; the links are only the batch's key changes.
    """
    from pyspark.sql import functions as sf

    current = links
    while True:
        a, b, c = current.alias("a"), current.alias("b"), current.alias("c")
        parent = sf.coalesce(sf.col(f"b.{_PARENT}"), sf.col(f"a.{_PARENT}"))
        step = (
            a.join(b, sf.col(f"a.{_PARENT}") == sf.col(f"b.{_CHILD}"), "left")
            .select(sf.col(f"a.{_CHILD}").alias(_CHILD), parent.alias(_PARENT))
            .alias("n")
            .join(c, sf.col(f"n.{_PARENT}") == sf.col(f"c.{_CHILD}"), "left")
            .select(
                sf.col(f"n.{_CHILD}").alias(_CHILD),
                sf.col(f"n.{_PARENT}").alias(_PARENT),
                sf.col(f"c.{_CHILD}").isNotNull().alias(_JUMPED),
            )
            .localCheckpoint(eager=True)
        )
        current = step.drop(_JUMPED)
        if step.filter(sf.col(_JUMPED)).isEmpty():
            return current


def _per_lineage(located: DataFrame, n: int, *, moved: bool) -> DataFrame:
    """Each lineage's outcome: its last event (kind, key, still the key's last segment?) and
    each of the ``n`` non-key columns' latest sent value.

    A lineage is named by the segment it began with, ``(_ROOTKEY, _ROOTSTART)``: the root columns
    ``located`` has when some key ``moved``, else the event's own segment. A key whose
    first event in the batch is an insert or arrival replaces whatever the previous state held
    there; a marker copy of that event (with no commit position, so it never wins ``max_by``)
    gives that previous row an empty lineage, which is dead, so the previous row is dropped.
    """
    from pyspark.sql import functions as sf

    opens_key = sf.col(_FIRST) & sf.col(_KIND).isin(INSERT, _ARRIVE)
    marker = sf.col(_MARKER)
    tagged = located.select(
        "*",
        sf.explode(
            sf.when(opens_key, sf.array(sf.lit(False), sf.lit(True))).otherwise(
                sf.array(sf.lit(False))
            )
        ).alias(_MARKER),
    )
    order = sf.when(~marker, sf.struct(sf.col(_LSN), sf.col(_SEQ), sf.col(_SUB)))
    last = sf.struct(
        sf.col(_KIND).alias("kind"), sf.col(_KEY).alias("key"), sf.col(_LATEST).alias("latest")
    )
    if moved:
        root_key = sf.when(marker, sf.col(_KEY)).otherwise(sf.col(_ROOTKEY))
        root_start = sf.when(~marker, sf.col(_ROOTSTART))
    else:
        # A lineage is a segment: grouping by the window's own key column (not an expression of
        # it) lets Spark reuse the window's partitioning instead of shuffling the changes again.
        root_key, root_start = sf.col(_KEY), sf.when(~marker, sf.col(_START))
    return tagged.groupBy(root_key.alias(_ROOTKEY), root_start.alias(_ROOTSTART)).agg(
        sf.max_by(last, order).alias(_LAST),
        *(
            sf.max_by(sf.col(_val(i)), sf.when(sf.col(_val(i)).isNotNull(), order)).alias(_val(i))
            for i in range(n)
        ),
    )


def _apply_to_state(
    state: DataFrame | None,
    outcome: DataFrame,
    keys: list[str],
    cols: list[str],
    values: list[str],
) -> DataFrame:
    """Join the lineages' outcomes with the previous state by the key each lineage began at.

    Lineages that began with a previous-state row join that row (to fill columns the batch never
    sent, and to replace it); lineages that began with an insert join nothing. Previous rows at
    keys the batch never touched join nothing and stay as they were.
    """
    from pyspark.sql import functions as sf

    last = sf.col(_LAST)
    from_state = sf.col(_ROOTSTART).isNull()
    alive = sf.coalesce(
        last.getField("kind").isin(INSERT, UPDATE, _ARRIVE) & last.getField("latest"), sf.lit(False)
    )
    batch = outcome.select(
        sf.when(from_state, sf.col(_ROOTKEY)).alias(_JOIN),
        alive.alias(_ALIVE),
        last.getField("key").alias(_FINAL),
        *(sf.col(_val(i)) for i in range(len(values))),
    ).filter(sf.col(_ALIVE) | sf.col(_JOIN).isNotNull())

    value_index = {c: i for i, c in enumerate(values)}
    key_index = {c: j for j, c in enumerate(keys)}
    if state is None:
        joined, in_batch, present = batch, sf.lit(True), sf.lit(False)
    else:
        previous = state.select(
            sf.struct(
                *(sf.col(_out(cols.index(k))).alias(f"k{j}") for j, k in enumerate(keys))
            ).alias(_SKEY),
            sf.lit(True).alias(_PRESENT),
            *(sf.col(_out(cols.index(c))).alias(_state_val(i)) for i, c in enumerate(values)),
        )
        joined = previous.join(batch, sf.col(_SKEY) == sf.col(_JOIN), "full_outer")
        in_batch, present = sf.col(_ALIVE).isNotNull(), sf.col(_PRESENT).isNotNull()

    out = []
    for i, c in enumerate(cols):
        if c in key_index:
            final = sf.col(_FINAL).getField(f"k{key_index[c]}")
            expr = (
                final
                if state is None
                else sf.when(in_batch, final).otherwise(sf.col(_SKEY).getField(f"k{key_index[c]}"))
            )
        else:
            v = value_index[c]
            sent = sf.col(_val(v))
            kept = sf.col(_state_val(v)) if state is not None else sf.lit(None)
            expr = (
                sf.when(~in_batch, kept)
                .when(sent.isNotNull(), sent.getField("v"))
                .when(present, kept)
                .when(
                    sf.col(_ALIVE),
                    sf.raise_error(
                        f"unchanged TOAST value of column {c!r} has no earlier version to keep: "
                        "an UPDATE reached a row that is neither in the previous state nor "
                        "inserted earlier in the batch"
                    ),
                )
            )
        out.append(expr.alias(_out(i)))
    return joined.filter(~in_batch | sf.col(_ALIVE)).select(*out)
