"""A keyed table's changes as the lives of its rows: the keyed half of ``merge.reduce`` (whose
docstring gives the plan and why).

Each change becomes an event at one key (two for an update that changes the key: an exit and an
arrival), events at a key form segments (one row version's stay there), and segments chained by
key changes form lineages (one row's life across keys). ``lineages`` gives one row per lineage:
``ROOT_KEY`` and ``ROOT_START`` name it by the segment it began with (``ROOT_START`` NULL for the
state's row at that key), ``LAST`` is its last event (``kind``, ``key``, and ``latest``: whether
that is still its key's last segment), and ``value_column(i)`` the ``i``-th non-key column's
latest sent value as ``struct(v)``, NULL where the lineage never sent it. ``alive`` says whether
a lineage ends with a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    INSERT,
    OLD,
    OP,
    SEQ,
    UNCHANGED,
    UPDATE,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Internal columns: every intermediate DataFrame holds only columns named under this prefix, so
# no table column name (they are arbitrary PostgreSQL identifiers) can collide with them or need
# quoting past the first step. The MERGE source's own columns (``merge.reduce``) use it too.
INTERNAL = "__pglr_"

# What ``lineages`` gives per lineage, besides ``value_column(i)``.
ROOT_KEY, ROOT_START = f"{INTERNAL}rootkey", f"{INTERNAL}rootstart"
LAST = f"{INTERNAL}last"

# Event kinds of a key-changing update, besides the changelog's own I/U/D.
_ARRIVE = "A"  # the row now lives under this (new) key
_EXIT = "X"  # the row left this (old) key

_KEY, _KIND, _LSN = f"{INTERNAL}key", f"{INTERNAL}kind", f"{INTERNAL}lsn"
_SEQ, _SUB, _NEW = f"{INTERNAL}seq", f"{INTERNAL}sub", f"{INTERNAL}new"
_OLDKEY, _MOVES, _DEST = f"{INTERNAL}oldkey", f"{INTERNAL}moves", f"{INTERNAL}dest"
_START, _LATEST, _FIRST = f"{INTERNAL}start", f"{INTERNAL}latest", f"{INTERNAL}first"
_MARKER, _CHILD, _PARENT = f"{INTERNAL}marker", f"{INTERNAL}child", f"{INTERNAL}parent"
_JUMPED = f"{INTERNAL}jumped"


def value_column(i: int) -> str:
    """The ``i``-th non-key column's value, in events, lineages and the MERGE source (upsert
    mode): ``struct(v)`` when sent, NULL when not."""
    return f"{INTERNAL}v{i}"


def column(name: str) -> Column:
    """A table column by its exact name (PostgreSQL names may contain dots or backticks)."""
    from pyspark.sql import functions as sf

    return sf.col("`" + name.replace("`", "``") + "`")


def is_unchanged(column: str) -> Column:
    """True where the row's ``column`` is an unchanged TOAST value, not a value (or real NULL)."""
    from pyspark.sql import functions as sf

    return sf.coalesce(sf.array_contains(sf.col(UNCHANGED), column), sf.lit(False))


def lineages(changes: DataFrame, keys: list[str], values: list[str]) -> tuple[DataFrame, bool]:
    """Each lineage's outcome (the module docstring says what its columns hold), and whether
    some update of the batch changed its row's key (only then are segments chained)."""
    from pyspark.sql import functions as sf

    moved = not changes.filter(_key_change(keys)[2]).isEmpty()
    located = _segments(_keyed_events(changes, keys, values))
    if moved:
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
            .alias(ROOT_KEY),
            sf.when(linked, sf.col(_PARENT).getField("start"))
            .otherwise(sf.col(_START))
            .alias(ROOT_START),
        )
    return _per_lineage(located, len(values), moved=moved), moved


def alive() -> Column:
    """True for a lineage that ends with a row: its last event left one, at its key's latest
    segment."""
    from pyspark.sql import functions as sf

    last = sf.col(LAST)
    return sf.coalesce(
        last.getField("kind").isin(INSERT, UPDATE, _ARRIVE) & last.getField("latest"), sf.lit(False)
    )


def _key_change(keys: list[str]) -> tuple[Column, Column, Column]:
    """The new key, the old key, and whether this change is an update that changes the key.

    A key column can itself be an unchanged TOAST value; PostgreSQL then sends the old key, and
    the new key's value is the old one.
    """
    from pyspark.sql import functions as sf

    old = sf.col(OLD)
    new_key = sf.struct(
        *(
            sf.when(is_unchanged(k) & old.isNotNull(), old.getField(k))
            .otherwise(column(k))
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
    and ``value_column(i)`` the ``i``-th non-key column as ``struct(v)`` when sent, NULL when
    the change did not send it (unchanged TOAST, or a delete/exit): a real NULL is
    ``struct(NULL)``.
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
            sf.when(~is_unchanged(c), sf.struct(column(c).alias("v"))).alias(value_column(i))
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
        *(
            sf.when(carries_values, sf.col(value_column(i))).alias(value_column(i))
            for i in range(len(values))
        ),
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

    A lineage is named by the segment it began with, ``(ROOT_KEY, ROOT_START)``: the root columns
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
        root_key = sf.when(marker, sf.col(_KEY)).otherwise(sf.col(ROOT_KEY))
        root_start = sf.when(~marker, sf.col(ROOT_START))
    else:
        # A lineage is a segment: grouping by the window's own key column (not an expression of
        # it) lets Spark reuse the window's partitioning instead of shuffling the changes again.
        root_key, root_start = sf.col(_KEY), sf.when(~marker, sf.col(_START))
    return tagged.groupBy(root_key.alias(ROOT_KEY), root_start.alias(ROOT_START)).agg(
        sf.max_by(last, order).alias(LAST),
        *(
            sf.max_by(
                sf.col(value_column(i)), sf.when(sf.col(value_column(i)).isNotNull(), order)
            ).alias(value_column(i))
            for i in range(n)
        ),
    )
