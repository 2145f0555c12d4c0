"""The state merge on a real local Spark and Delta: the current state a changelog batch leaves.

``merge_state`` below applies a batch the way ``materialize`` does: the previous state is a
Delta table, ``net_changes`` reduces the batch, ``apply`` runs the MERGE (or append, or
overwrite) with an app transaction, and the table is read back. Every scenario is checked
against the rows PostgreSQL itself would hold after the same statements; the property test
checks random operation sequences against a plain-Python model. Spark jobs cost about a second
each here, so related scenarios share one batch.
"""

from __future__ import annotations

import atexit
import itertools
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from airflow_pglogrepl.merge import reduce as merge_module
from airflow_pglogrepl.merge.materialize import apply
from airflow_pglogrepl.merge.reduce import net_changes

_TABLES = tempfile.mkdtemp(prefix="pglogrepl-merge-tests-")
atexit.register(shutil.rmtree, _TABLES, True)
_versions = itertools.count(1)


def merge_state(
    previous: DataFrame | None,
    changes: DataFrame,
    *,
    key: Sequence[str],
    columns: Sequence[str],
    full_identity: bool = False,
    table: str | None = None,
) -> DataFrame:
    """``previous`` as a Delta table (deletion vectors on), the batch applied, the table after.

    A ``previous`` this function returned is merged into in place (its table is the state).
    """
    spark = changes.sparkSession
    path = getattr(previous, "_delta_path", None)
    if path is None:
        path = tempfile.mkdtemp(dir=_TABLES)
        if previous is None:
            fields = [f for f in changes.schema.fields if f.name in columns]
            previous = spark.createDataFrame([], StructType(fields))
        previous.write.format("delta").option("delta.enableDeletionVectors", "true").mode(
            "overwrite"
        ).save(path)
    target = spark.read.format("delta").load(path)
    net = net_changes(
        changes, target, key=key, columns=columns, full_identity=full_identity, table=table
    )
    apply(spark, net, path, app="tests", version=next(_versions))
    after = spark.read.format("delta").load(path)
    after._delta_path = path
    return after


# The table under test: int key, bigint, text, numeric, timestamp, a nullable note, and a
# "TOASTed" text body (the column PostgreSQL sends as unchanged when an update leaves it alone).
TABLE = StructType(
    [
        StructField("id", IntegerType(), False),
        StructField("n", LongType()),
        StructField("name", StringType()),
        StructField("amount", DecimalType(12, 2)),
        StructField("at", TimestampType()),
        StructField("note", StringType()),
        StructField("body", StringType()),
    ]
)
COLUMNS = [f.name for f in TABLE.fields]
T0 = datetime(2024, 5, 1, 12, 30, 15, 123456)
BIG = "x" * 5000


def changelog_schema(table: StructType) -> StructType:
    """The changelog contract for ``table``: its columns (nullable) plus the metadata columns."""
    nullable = [StructField(f.name, f.dataType, True) for f in table.fields]
    return StructType(
        [
            *nullable,
            StructField("_op", StringType()),
            StructField("_commit_lsn", LongType()),
            StructField("_seq", LongType()),
            StructField("_xid", LongType()),
            StructField("_commit_ts", TimestampType()),
            StructField("_unchanged", ArrayType(StringType())),
            StructField("_old", StructType(nullable)),
        ]
    )


class Log:
    """Builds a changelog batch the way the drain writes one, transaction by transaction."""

    def __init__(self, columns: Sequence[str], lsn: int = 0x1000) -> None:
        self.columns = list(columns)
        self.rows: list[tuple[Any, ...]] = []
        self.lsn = lsn
        self.seq = 0

    def txn(self) -> Log:
        """Start a new transaction: a later commit LSN, ``_seq`` counting again from 1."""
        self.lsn += 0x100
        self.seq = 0
        return self

    def change(
        self,
        op: str,
        values: dict[str, Any],
        unchanged: Iterable[str] = (),
        old: dict[str, Any] | None = None,
    ) -> Log:
        self.seq += 1
        unknown = set(values) - set(self.columns)
        assert not unknown, unknown
        row = [values.get(c) for c in self.columns]
        old_row = None if old is None else tuple(old.get(c) for c in self.columns)
        self.rows.append(
            (*row, op, self.lsn, self.seq, self.lsn // 16, T0, sorted(unchanged), old_row)
        )
        return self

    def insert(self, **values: Any) -> Log:
        return self.change("I", values)

    def update(
        self, unchanged: Iterable[str] = (), old: dict[str, Any] | None = None, **values: Any
    ) -> Log:
        return self.change("U", values, unchanged, old)

    def delete(self, **values: Any) -> Log:
        return self.change("D", values)

    def truncate(self) -> Log:
        return self.change("T", {})

    def frame(self, spark: SparkSession, table: StructType = TABLE) -> DataFrame:
        # Newest first: files are read in no particular order, and only (_commit_lsn, _seq)
        # may decide the order in which changes apply.
        return spark.createDataFrame(self.rows[::-1], changelog_schema(table))


def row(id: int, **values: Any) -> dict[str, Any]:
    """A full row of TABLE with defaults for the columns a scenario does not care about."""
    base = {"n": id * 10, "name": f"r{id}", "amount": Decimal("1.50"), "at": T0, "body": BIG}
    return {"id": id, **base, **values}


def state_of(spark: SparkSession, rows: Iterable[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([tuple(r.get(c) for c in COLUMNS) for r in rows], TABLE)


def result(df: DataFrame) -> list[dict[str, Any]]:
    """The merged state as dicts, in a stable order (the state itself has none)."""
    return sorted((r.asDict() for r in df.collect()), key=repr)


def expect(*rows: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(({c: r.get(c) for c in COLUMNS} for r in rows), key=repr)


def merge(previous: DataFrame | None, log: Log, spark: SparkSession, **kw: Any) -> DataFrame:
    return merge_state(previous, log.frame(spark), key=["id"], columns=COLUMNS, **kw)


# -- basics ---------------------------------------------------------------------------------------


def test_import_does_not_load_pyspark() -> None:
    code = (
        "import sys, airflow_pglogrepl.merge.reduce, airflow_pglogrepl.merge.materialize; "
        "assert 'pyspark' not in sys.modules and 'delta' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_insert_update_delete_keep_column_types(spark: SparkSession) -> None:
    log = Log(COLUMNS).txn().insert(**row(1)).insert(**row(2)).insert(**row(3))
    log.txn().update(**row(2, name="two", amount=Decimal("99.99"), note="n"))
    log.txn().delete(id=3)
    merged = merge(None, log, spark)
    assert [(f.name, f.dataType) for f in merged.schema.fields] == [
        (f.name, f.dataType) for f in TABLE.fields
    ]
    assert result(merged) == expect(row(1), row(2, name="two", amount=Decimal("99.99"), note="n"))


def test_unchanged_toast_keeps_value_across_updates_and_batches(spark: SparkSession) -> None:
    # Batch 1: the body is sent once, then left unchanged by two updates; row 2's note and body
    # are set to a real NULL, which must not be mistaken for "unchanged".
    first = Log(COLUMNS).txn().insert(**row(1, body="original")).insert(**row(2, note="x"))
    first.txn().update(unchanged=["body"], **row(1, n=11, body=None))
    first.txn().update(unchanged=["body"], **row(1, n=12, body=None))
    first.txn().update(**row(2, note=None, body=None))
    state = merge(None, first, spark)
    assert result(state) == expect(row(1, n=12, body="original"), row(2, note=None, body=None))

    # Batch 2 on top of it: the body still comes from the previous state, through two updates;
    # row 3 only exists in the previous state and loses its note (real NULL) but not its body.
    previous = state_of(spark, [*result(state), row(3, note="keep?", body="b3")])
    second = Log(COLUMNS, lsn=0x9000).txn()
    second.update(unchanged=["body"], **row(1, n=13, body=None))
    second.txn().update(unchanged=["body", "note"], **row(1, n=13, name="renamed", body=None))
    second.update(unchanged=["body"], **row(3, note=None, body=None))
    assert result(merge(previous, second, spark)) == expect(
        row(1, n=13, name="renamed", body="original"),
        row(2, note=None, body=None),
        row(3, note=None, body="b3"),
    )


def test_unchanged_value_without_any_earlier_version_fails_loudly(spark: SparkSession) -> None:
    log = Log(COLUMNS).txn().update(unchanged=["body"], **row(7, body=None))
    with pytest.raises(Exception, match="unchanged TOAST value of column 'body'"):
        merge(None, log, spark).collect()  # the MERGE itself fails: nothing is committed


# -- key changes ----------------------------------------------------------------------------------


def test_key_changing_updates(spark: SparkSession) -> None:
    previous = state_of(
        spark,
        [row(1, body="b1"), row(2, body="b2"), row(10, body="b10"), row(11, body="b11")],
    )
    log = Log(COLUMNS).txn()
    # 1 -> 5 with the body unchanged: the body follows the row to its new key.
    log.update(unchanged=["body"], old={"id": 1}, **row(5, name="moved", body=None))
    # 2 -> 6 with a new body: nothing carried over.
    log.update(old={"id": 2}, **row(6, body="new6"))
    # A chain in one batch: inserted 20, then 20 -> 21 -> 22 -> 23, unchanged each time (three
    # links: more than one round of pointer jumping).
    log.txn().insert(**row(20, body="b20"))
    log.txn().update(unchanged=["body"], old={"id": 20}, **row(21, n=1, body=None))
    log.txn().update(unchanged=["body"], old={"id": 21}, **row(22, n=1, name="chain", body=None))
    log.txn().update(unchanged=["body"], old={"id": 22}, **row(23, n=1, name="chain", body=None))
    # Swap 10 and 11 in one transaction through a free key (immediate unique constraints make a
    # direct swap impossible in PostgreSQL): 10 -> 99, 11 -> 10, 99 -> 11.
    log.txn().update(unchanged=["body"], old={"id": 10}, **row(99, name="was10", body=None))
    log.update(unchanged=["body"], old={"id": 11}, **row(10, name="was11", body=None))
    log.update(unchanged=["body"], old={"id": 99}, **row(11, name="was10", body=None))
    assert result(merge(previous, log, spark)) == expect(
        row(5, name="moved", body="b1"),
        row(6, body="new6"),
        row(23, name="chain", n=1, body="b20"),
        row(11, name="was10", body="b10"),
        row(10, name="was11", body="b11"),
    )


def test_key_moves_away_and_back_and_unchanged_key_with_old_key(spark: SparkSession) -> None:
    previous = state_of(spark, [row(1, body="b1"), row(2, body="b2")])
    log = Log(COLUMNS).txn()
    log.update(unchanged=["body"], old={"id": 1}, **row(3, body=None))
    log.txn().update(unchanged=["body"], old={"id": 3}, **row(1, n=7, body=None))
    # PostgreSQL also sends the old key when the key itself is an unchanged TOAST value: the key
    # did not change, so this is a plain update of row 2.
    unsent_key = {**row(2, name="same", body=None), "id": None}
    log.txn().update(unchanged=["id", "body"], old={"id": 2}, **unsent_key)
    assert result(merge(previous, log, spark)) == expect(
        row(1, n=7, body="b1"), row(2, name="same", body="b2")
    )


# -- deletes, re-inserts, truncates ---------------------------------------------------------------


def test_delete_reinsert_and_truncate_in_the_middle(spark: SparkSession) -> None:
    previous = state_of(spark, [row(1), row(2, body="old2"), row(3)])
    log = Log(COLUMNS).txn().delete(id=1).insert(**row(1, name="again"))
    log.txn().update(unchanged=["body"], **row(2, n=5, body=None))
    log.txn().truncate()
    # After the truncate: only these exist, whatever came before.
    log.txn().insert(**row(3, name="after", body="fresh")).insert(**row(4))
    log.txn().update(unchanged=["body"], **row(3, n=33, name="after", body=None))
    log.txn().delete(id=4).insert(**row(4, name="back"))
    assert result(merge(previous, log, spark)) == expect(
        row(3, n=33, name="after", body="fresh"), row(4, name="back")
    )


def test_insert_over_an_existing_row_replaces_it(spark: SparkSession) -> None:
    # Not something PostgreSQL sends for a keyed table, but a replayed insert must not duplicate:
    # the last insert wins over the previous state's row, over an updated row, over an insert.
    previous = state_of(spark, [row(1, body="old"), row(2, body="old2")])
    log = Log(COLUMNS).txn().insert(**row(1, name="new", body="new"))
    log.txn().update(unchanged=["body"], **row(2, n=5, body=None)).insert(**row(2, name="re"))
    log.txn().insert(**row(3)).insert(**row(3, name="twice"))
    assert result(merge(previous, log, spark)) == expect(
        row(1, name="new", body="new"), row(2, name="re"), row(3, name="twice")
    )


def test_same_batch_twice_gives_the_same_state(spark: SparkSession) -> None:
    previous = state_of(spark, [row(1, body="b1"), row(2)])
    log = Log(COLUMNS).txn().update(unchanged=["body"], old={"id": 1}, **row(8, body=None))
    log.txn().insert(**row(9)).delete(id=2)
    changes = log.frame(spark)
    once = result(merge_state(previous, changes, key=["id"], columns=COLUMNS))
    again = result(merge_state(previous, changes, key=["id"], columns=COLUMNS))
    assert once == again == expect(row(8, body="b1"), row(9))


def test_odd_column_names_and_composite_key(spark: SparkSession) -> None:
    table = StructType(
        [
            StructField("a.b", IntegerType()),
            StructField("k`2", StringType()),
            StructField("__pglr_c0", StringType()),  # named like one of the merge's own columns
        ]
    )
    cols = [f.name for f in table.fields]
    previous = spark.createDataFrame([(1, "x", "keep")], table)
    log = Log(cols).txn()
    log.change("U", {"a.b": 2, "k`2": "x"}, unchanged=["__pglr_c0"], old={"a.b": 1, "k`2": "x"})
    log.change("I", {"a.b": 1, "k`2": "y", "__pglr_c0": "new"})
    merged = merge_state(previous, log.frame(spark, table), key=["a.b", "k`2"], columns=cols)
    assert merged.columns == cols
    assert sorted(tuple(r) for r in merged.collect()) == [(1, "y", "new"), (2, "x", "keep")]


# -- REPLICA IDENTITY FULL and no identity --------------------------------------------------------


def test_full_identity_keeps_duplicates_exactly(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Copies are expanded in chunks; tiny chunks make three copies cross a chunk boundary.
    monkeypatch.setattr(merge_module, "_CHUNK", 2)
    same = row(1, body="dup")
    previous = state_of(spark, [same, same, same, same, same, row(2, body="b2")])
    log = Log(COLUMNS).txn()
    log.delete(**same)  # removes one of five identical rows
    log.txn().update(old=same, unchanged=["body"], **row(1, name="changed", body=None))
    log.txn().insert(**row(2, body="b2"))  # a second identical copy of row 2
    log.txn().update(old=row(2, body="b2"), **row(2, body="b2", note="one of two"))
    merged = merge_state(previous, log.frame(spark), key=[], columns=COLUMNS, full_identity=True)
    assert result(merged) == expect(
        same,
        same,
        same,
        row(1, name="changed", body="dup"),
        row(2, body="b2"),
        row(2, body="b2", note="one of two"),
    )

    # PostgreSQL always sends the old row under FULL; without it no copy can be chosen.
    log.txn().update(**row(2, note="which one?"))
    with pytest.raises(Exception, match="UPDATE without its old row"):
        merge_state(previous, log.frame(spark), key=[], columns=COLUMNS, full_identity=True)


def test_no_identity_takes_inserts_and_truncates_and_refuses_updates(spark: SparkSession) -> None:
    previous = state_of(spark, [row(1), row(1)])
    log = Log(COLUMNS).txn().insert(**row(2)).txn().truncate().txn().insert(**row(3))
    log.insert(**row(3))
    merged = merge_state(previous, log.frame(spark), key=[], columns=COLUMNS)
    assert result(merged) == expect(row(3), row(3))
    assert result(merge_state(previous, Log(COLUMNS).frame(spark), key=[], columns=COLUMNS)) == (
        expect(row(1), row(1))
    )

    log.txn().delete(**row(3))
    with pytest.raises(ValueError, match=r"table public\.t has no replica identity"):
        merge_state(previous, log.frame(spark), key=[], columns=COLUMNS, table="public.t")


def test_arguments_are_checked_before_any_job(spark: SparkSession) -> None:
    changes = Log(COLUMNS).frame(spark)
    with pytest.raises(ValueError, match="key"):
        merge_state(None, changes, key=["nope"], columns=COLUMNS)
    with pytest.raises(ValueError, match="lack changelog columns"):
        merge_state(None, changes.drop("_unchanged"), key=["id"], columns=COLUMNS)


# -- property: random operation sequences against a plain-Python model -------------------------

SMALL = StructType(
    [
        StructField("id", IntegerType(), False),
        StructField("a", IntegerType()),
        StructField("t", StringType()),
    ]
)
SMALL_COLS = [f.name for f in SMALL.fields]
SmallRow = tuple[int, int | None, str | None]

# (operation, key choice, second key choice, new value of ``a``, body unchanged?, new txn?)
Step = tuple[str, int, int, int | None, bool, bool]
steps = st.lists(
    st.tuples(
        # Weighted: truncates are rare, or they would wipe out most of what a plan builds.
        st.sampled_from(["insert"] * 3 + ["update"] * 2 + ["move"] * 2 + ["delete", "truncate"]),
        st.integers(0, 4),
        st.integers(0, 4),
        st.one_of(st.none(), st.integers(0, 9)),
        st.booleans(),
        st.booleans(),
    ),
    max_size=14,
)


def play(model: dict[int, tuple[int | None, str | None]], plan: list[Step], log: Log) -> None:
    """Apply ``plan`` to ``model`` (key -> (a, t)) and write what PostgreSQL would send to ``log``.

    Steps that would be invalid in PostgreSQL (insert over a live key, update of nothing, move
    onto a live key) are skipped, as the source database would have refused them.
    """
    for number, (op, k, k2, a, keep_t, new_txn) in enumerate(plan):
        if new_txn:
            log.txn()
        live = sorted(model)
        if op == "insert" and k not in model:
            model[k] = (a, f"t{number}")
            log.insert(id=k, a=a, t=f"t{number}")
        elif op == "truncate":
            model.clear()
            log.truncate()
        elif not live:
            continue
        elif op == "update":
            key = live[k % len(live)]
            t = model[key][1] if keep_t else (None if a == 0 else f"u{number}")
            model[key] = (a, t)
            sent = None if keep_t else t
            log.update(unchanged=["t"] if keep_t else [], id=key, a=a, t=sent)
        elif op == "move" and k2 not in model:
            key = live[k % len(live)]
            old_t = model.pop(key)[1]
            t = old_t if keep_t else f"m{number}"
            model[k2] = (a, t)
            sent = None if keep_t else t
            log.update(unchanged=["t"] if keep_t else [], old={"id": key}, id=k2, a=a, t=sent)
        elif op == "delete":
            key = live[k % len(live)]
            del model[key]
            log.delete(id=key)


# A few examples here (each is a Spark run of its own, seconds); the many plans without a
# TRUNCATE are checked all at once below.
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial=st.dictionaries(st.integers(0, 4), st.one_of(st.none(), st.integers(0, 9)), max_size=3),
    plan=steps,
    split=st.integers(0, 14),
)
def test_merge_matches_a_sequential_model(
    spark: SparkSession, initial: dict[int, int | None], plan: list[Step], split: int
) -> None:
    model: dict[int, tuple[int | None, str | None]] = {k: (a, f"s{k}") for k, a in initial.items()}
    start = [(k, *v) for k, v in model.items()]
    first, second = Log(SMALL_COLS), Log(SMALL_COLS, lsn=0x100000)
    play(model, plan[:split], first)
    play(model, plan[split:], second)

    def merged(previous: DataFrame, log: Log) -> DataFrame:
        return merge_state(previous, log.frame(spark, SMALL), key=["id"], columns=SMALL_COLS)

    # Batch 2 merges onto batch 1's result directly: one Spark run for both, which keeps the
    # example cheap; the state in between is whatever batch 1 produced.
    final = merged(merged(spark.createDataFrame(start, SMALL), first), second)
    got = sorted((tuple(r) for r in final.collect()), key=repr)
    assert got == sorted(((k, *v) for k, v in model.items()), key=repr)


def shifted(rows: list[tuple[Any, ...]], offset: int) -> list[tuple[Any, ...]]:
    """Changelog rows of ``Log`` with every key (the row's and its old row's) moved by
    ``offset``."""
    out = []
    for row in rows:
        old = row[-1]
        if old is not None:
            old = (None if old[0] is None else old[0] + offset, *old[1:])
        out.append((None if row[0] is None else row[0] + offset, *row[1:-1], old))
    return out


def test_many_plans_merged_at_once_match_their_sequential_models(spark: SparkSession) -> None:
    """The sequential model again, for 60 seeded random plans in one Spark run: each plan on
    keys and commit LSNs of its own, so no plan's changes touch another's rows. No TRUNCATE
    (it would empty every plan's keys): the property test above keeps those."""
    rng = random.Random(20261126)
    ops = ["insert"] * 3 + ["update"] * 2 + ["move"] * 2 + ["delete"]
    start: list[tuple[Any, ...]] = []
    expected: list[tuple[Any, ...]] = []
    first, second = Log(SMALL_COLS), Log(SMALL_COLS)
    for number in range(60):
        offset = 10 * number
        keys = rng.sample(range(5), rng.randint(0, 3))
        model = {k: (rng.choice([None, *range(10)]), f"s{k}") for k in keys}
        start += [(k + offset, *v) for k, v in model.items()]
        plan: list[Step] = [
            (rng.choice(ops), rng.randrange(5), rng.randrange(5),
             rng.choice([None, *range(10)]), rng.random() < 0.5, rng.random() < 0.5)
            for _ in range(rng.randint(0, 14))
        ]  # fmt: skip
        split = rng.randint(0, 14)
        one, two = (
            Log(SMALL_COLS, 0x1000 + number * 0x4000),
            Log(SMALL_COLS, 0x200000 + number * 0x4000),
        )
        play(model, plan[:split], one)
        play(model, plan[split:], two)
        first.rows += shifted(one.rows, offset)
        second.rows += shifted(two.rows, offset)
        expected += [(k + offset, *v) for k, v in model.items()]

    def merged(previous: DataFrame, log: Log) -> DataFrame:
        return merge_state(previous, log.frame(spark, SMALL), key=["id"], columns=SMALL_COLS)

    moves = sum(1 for row in first.rows + second.rows if row[-1] is not None)
    assert len(first.rows) + len(second.rows) > 300 and moves > 30 and len(expected) > 100
    final = merged(merged(spark.createDataFrame(start, SMALL), first), second)
    assert sorted((tuple(r) for r in final.collect()), key=repr) == sorted(expected, key=repr)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from(["insert", "update", "delete"]), st.integers(0, 5), st.booleans()
        ),
        max_size=10,
    )
)
def test_full_identity_matches_a_multiset_model(
    spark: SparkSession, plan: list[tuple[str, int, bool]]
) -> None:
    # Values from a tiny domain so that identical rows are common.
    bag: Counter[SmallRow] = Counter({(1, 0, "x"): 2})
    log = Log(SMALL_COLS)
    for op, choice, keep_t in plan:
        log.txn()
        rows = sorted(bag.elements(), key=repr)
        if op == "insert":
            new: SmallRow = (choice % 2, choice % 3 or None, "x")
            bag[new] += 1
            log.insert(id=new[0], a=new[1], t=new[2])
        elif rows:
            old = rows[choice % len(rows)]
            bag[old] -= 1
            old_values = dict(zip(SMALL_COLS, old, strict=True))
            if op == "delete":
                log.delete(**old_values)
            else:
                new = (old[0], choice % 2, old[2] if keep_t else "y")
                bag[new] += 1
                sent = {"id": new[0], "a": new[1], "t": None if keep_t else new[2]}
                log.update(unchanged=["t"] if keep_t else [], old=old_values, **sent)
    previous = spark.createDataFrame([(1, 0, "x"), (1, 0, "x")], SMALL)
    out = merge_state(
        previous, log.frame(spark, SMALL), key=[], columns=SMALL_COLS, full_identity=True
    )
    assert Counter(tuple(r) for r in out.collect()) == +bag
