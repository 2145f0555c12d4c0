"""history/ of a drained lake against the source's own log (test_decoding), through two kills.

A random workload on three tables (a keyed one whose big column is stored out of line, so that
updates leave it an unchanged TOAST value, some moving the row to another key, deletes and
TRUNCATEs; one under REPLICA IDENTITY FULL holding copies; one without any identity) is drained
in rounds with history on. Two runs of the application are killed (SIGKILL's exit, nothing
cleaned up) in the middle of their history merges, the second with its MERGEs on Spark (as a
later round's merge is): the history goes from delta-rs' files to Spark's deletion vectors and
back. The history must then hold exactly the
versions the source's log says each row had, and, at every window end, agree with
``state_as_of`` wherever that answers.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import pytest

from airflow_pglogrepl.changelog.history_columns import (
    ENDED_BY,
    IS_CURRENT,
    VALID_FROM_LSN,
    VALID_FROM_SEQ,
    VALID_TO_LSN,
    VALID_TO_SEQ,
)
from airflow_pglogrepl.exceptions import ReplayRangeError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.replay import state_as_of
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.history import history_tables, merge_history
from airflow_pglogrepl.pgoutput.changes import Change
from airflow_pglogrepl.tables import TableRef
from tests.support.decoding_text import TestDecodingStream
from tests.support.drain import drain_app, drain_in_process
from tests.support.sources import Source

pytestmark = [pytest.mark.live, pytest.mark.spark]

TABLES = {"k": ["id", "v", "big"], "copies": ["a", "b"], "notes": ["n", "t"]}
ARGS = ("--max-window-bytes", "16000", "--history", "*", "--no-materialize")
# A version: (table, its values, (xid, place) it began at, (xid, place) it ended at, why)
Version = tuple[str, tuple[Any, ...], tuple[int, int], tuple[int, int] | None, str | None]


def test_history_equals_the_sources_log_through_two_kills(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    reference = f"{source.slot}_td"
    source.sql("CREATE SEQUENCE ids")
    source.sql("CREATE TABLE k (id int PRIMARY KEY, v int, big text)")
    source.sql("ALTER TABLE k ALTER COLUMN big SET STORAGE EXTERNAL")
    source.sql("CREATE TABLE copies (a int, b text)")
    source.sql("ALTER TABLE copies REPLICA IDENTITY FULL")
    source.sql("CREATE TABLE notes (n int, t text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE k, copies, notes")
    source.sql("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (reference,))
    lake_root = str(tmp_path / "lake")
    rng = random.Random(20261205)
    try:
        for round_ in range(4):
            workload(source, rng, transactions=25)
            if round_ in (1, 2):  # killed in its history merge: before a write, after a commit
                fault = "history_created" if round_ == 1 else "history_committed:2"
                # (the second on Spark: its MERGEs are Spark's, deletion vectors)
                on_spark = ("--history-spark-bytes", "0") if round_ == 2 else ()
                killed = drain_app(source, lake_root, *ARGS, *on_spark, fault=fault)
                assert killed.returncode == 137, killed.stderr[-3000:]
            drain_in_process(spark, source, lake_root, window=16000)
            lake = Lake(lake_root, source.slot)
            merged = merge_history(lake, history_tables(lake, True), spark=lambda: spark,
                                   spark_bytes=0 if round_ == 3 else None)  # fmt: skip
            assert sorted(merged) == ["public.copies", "public.k", "public.notes"]
        lake = Lake(lake_root, source.slot)
        assert spark_merged(lake, "public.k")  # (the rounds on Spark did end versions there)
        assert versions_in_lake(lake_root) == versions_in_log(source, reference)
        answered = agree_with_state_as_of(lake)
        assert answered >= 4, answered  # (at least where each round merged the states)
        for table, columns in TABLES.items():  # and the current versions are the source's rows
            names = ", ".join(columns)
            rows = source.sql(f"SELECT {names} FROM {table}")
            assert sorted(map(repr, current(lake_root, table))) == sorted(map(repr, rows))
    finally:
        source.sql("SELECT pg_drop_replication_slot(%s)", (reference,))


def spark_merged(lake: Lake, name: str) -> bool:
    """Whether a commit of ``history/<name>`` is a MERGE that Spark made."""
    from airflow_pglogrepl.lake.commit_infos import newest_first

    uri = lake.paths.history(name)
    table = delta.open_table(uri)
    assert table is not None
    return any(c.get("operation") == "MERGE" and "Spark" in str(c.get("engineInfo"))
               for c in newest_first(uri, int(table.version())))  # fmt: skip


def workload(source: Source, rng: random.Random, *, transactions: int) -> None:
    """Transactions of one to three random statements; a statement that finds no row changes
    nothing."""
    with psycopg.connect(source.dsn) as conn:
        conn.execute("SELECT setseed(%s)", (rng.random(),))
        conn.commit()
        for _ in range(transactions):
            for _ in range(rng.randint(1, 3)):
                conn.execute(*statement(rng))
            conn.commit()


def statement(rng: random.Random) -> tuple[str, tuple[Any, ...]]:
    one_k = "(SELECT id FROM k ORDER BY random() LIMIT 1)"
    one_copy = "(SELECT ctid FROM copies ORDER BY random() LIMIT 1)"
    big = "".join(rng.choice("0123456789abcdef") for _ in range(3000))  # stored out of line
    choices: list[tuple[str, tuple[Any, ...]]] = [
        ("INSERT INTO k VALUES (nextval('ids'), %s, %s)", (rng.randrange(100), big)),
        ("INSERT INTO k VALUES (nextval('ids'), %s, NULL)", (rng.randrange(100),)),
        (f"UPDATE k SET v = %s WHERE id = {one_k}", (rng.randrange(100),)),  # big unchanged
        (f"UPDATE k SET big = %s WHERE id = {one_k}", (big,)),
        (f"UPDATE k SET id = nextval('ids') WHERE id = {one_k}", ()),  # a key change
        (f"DELETE FROM k WHERE id = {one_k}", ()),
        ("INSERT INTO copies VALUES (%s, %s)", (rng.randrange(3), rng.choice(["x", "y"]))),
        (f"UPDATE copies SET a = %s WHERE ctid = {one_copy}", (rng.randrange(3),)),
        (f"DELETE FROM copies WHERE ctid = {one_copy}", ()),
        ("INSERT INTO notes VALUES (%s, %s)", (rng.randrange(5), "n")),
    ]
    if rng.random() < 0.04:
        return (f"TRUNCATE {rng.choice(['k', 'copies', 'notes'])}", ())
    return rng.choice(choices)


def versions_in_log(source: Source, slot: str) -> list[Version]:
    """Every version of every row, replayed from test_decoding's text, one change at a time:
    a place is ``(xid, the change's place among its transaction's)``."""
    options = {"include-xids": "1", "include-timestamp": "1", "skip-empty-xacts": "1"}
    rows = source.hook().peek_changes(slot, upto_lsn=None, options=options, binary=False)
    made: list[list[Any]] = []
    current: dict[str, list[int]] = defaultdict(list)  # table -> open versions, oldest first
    places: dict[int, int] = defaultdict(int)
    for event in TestDecodingStream().decode(rows):
        if not isinstance(event, Change):
            continue
        table = event.relation[1]
        place = (event.xid, places[event.xid])
        places[event.xid] += 1
        columns = TABLES[table]
        if event.op == "T":
            for index in current.pop(table, []):
                made[index][3:] = [place, "truncate"]
            continue
        new = event.new or {}
        if event.op in ("U", "D"):
            old = event.old if event.old is not None else new
            ended = end_one(made, current[table], table, old, columns)
            if ended is not None:
                moved = table == "k" and old["id"] != new.get("id", old["id"])
                why = "delete" if event.op == "D" else ("key_change" if moved else "update")
                made[ended][3:] = [place, why]
            for name in event.unchanged_toast:
                new = {**new, name: made[ended][1][columns.index(name)]} if ended is not None \
                    else new  # fmt: skip
        if event.op in ("I", "U"):
            made.append([table, tuple(new[c] for c in columns), place, None, None])
            current[table].append(len(made) - 1)
    return sorted((tuple(v) for v in made), key=repr)  # type: ignore[misc]


def end_one(made: list[list[Any]], open_: list[int], table: str, old: dict[str, Any],
            columns: list[str]) -> int | None:  # fmt: skip
    """The open version an update or delete ends: by key, or for a table without one the
    oldest equal copy."""
    names = ["id"] if table == "k" else columns
    for index in open_:
        if all(made[index][1][columns.index(n)] == old.get(n) for n in names):
            open_.remove(index)
            return index
    return None


def places_in_lake(lake_root: str) -> dict[tuple[int, int], tuple[int, int]]:
    """``(_commit_lsn, _seq)`` -> ``(xid, place among its transaction's changes)`` from the
    changelogs of the three tables."""
    seen: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for table in TABLES:
        rows = delta.scan(f"{lake_root}/changes/public.{table}",
                          columns=["_commit_lsn", "_seq", "_xid"]).to_pylist()  # fmt: skip
        for row in rows:
            seen[row["_xid"]].append((row["_commit_lsn"], row["_seq"]))
    places = {}
    for xid, changes in seen.items():
        for place, change in enumerate(sorted(changes)):
            places[change] = (xid, place)
    return places


def versions_in_lake(lake_root: str) -> list[Version]:
    places = places_in_lake(lake_root)
    out: list[Version] = []
    for table, columns in TABLES.items():
        for row in delta.scan(f"{lake_root}/history/public.{table}").to_pylist():
            began = places[(row[VALID_FROM_LSN], row[VALID_FROM_SEQ])]
            ended = (None if row[VALID_TO_LSN] is None
                     else places[(row[VALID_TO_LSN], row[VALID_TO_SEQ])])  # fmt: skip
            assert row[IS_CURRENT] == (ended is None)
            out.append((table, tuple(row[c] for c in columns), began, ended, row[ENDED_BY]))
    return sorted(out, key=repr)


def current(lake_root: str, table: str) -> list[tuple[Any, ...]]:
    rows = delta.scan(f"{lake_root}/history/public.{table}")
    rows = rows.filter(rows.column(IS_CURRENT))
    return [tuple(r[c] for c in TABLES[table]) for r in rows.to_pylist()]


def agree_with_state_as_of(lake: Lake) -> int:
    """At every window end, the versions valid there are ``state_as_of`` there, where it
    answers; how many positions it answered at."""
    answered = 0
    for window in lake.windows():
        lsn = LSN(window["end_lsn"])
        found_all = True
        for table, columns in TABLES.items():
            try:
                state = state_as_of(lake.paths.root, TableRef("public", table), lsn,
                                    slot=lake.slot)  # fmt: skip
            except ReplayRangeError:
                found_all = False
                break
            rows = delta.scan(lake.paths.history(TableRef("public", table)))
            began = pc.fill_null(pc.less(rows.column(VALID_FROM_LSN), int(lsn)), True)
            ends = pc.fill_null(pc.greater_equal(rows.column(VALID_TO_LSN), int(lsn)), True)
            valid = rows.filter(pc.and_(began, ends))
            ours = sorted(repr(tuple(r[c] for c in columns)) for r in valid.to_pylist())
            theirs = sorted(repr(tuple(r[c] for c in columns)) for r in state.to_pylist())
            assert ours == theirs, (table, lsn)
        answered += found_all
    return answered


def test_a_table_copied_again_begins_its_history_again_and_says_so(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """A table added to the publication holding rows (backfilled: no change brought them) and a
    resync of another: the history takes each copy, never a silent jump."""
    source.sql("CREATE TABLE k (id int PRIMARY KEY, v int, big text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE k")
    source.sql("INSERT INTO k SELECT g, g, 'x' FROM generate_series(1, 30) g")
    lake_root = str(tmp_path / "lake")
    drain_in_process(spark, source, lake_root, window=1 << 20)
    lake = Lake(lake_root, source.slot)
    merge_history(lake, history_tables(lake, True))
    source.sql("CREATE TABLE b (id int PRIMARY KEY, v text)")
    source.sql("INSERT INTO b SELECT g, 'b' FROM generate_series(1, 200) g")
    source.sql(f"ALTER PUBLICATION {source.publication} ADD TABLE b")
    source.sql("UPDATE b SET v = 'changed' WHERE id <= 10")
    source.sql("UPDATE k SET v = -v WHERE id <= 5")
    result = drain_in_process(spark, source, lake_root, window=1 << 20, backfill_rows=100)
    assert result["backfills"]["public.b"] == {"built": True}, result["backfills"]
    merge_history(lake, history_tables(lake, True))
    b = delta.scan(lake.paths.history(TableRef("public", "b"))).to_pylist()
    assert len(b) == 200 and all(r[IS_CURRENT] and r[VALID_FROM_LSN] is None for r in b)
    assert sorted((r["id"], r["v"]) for r in b) == sorted(source.sql("SELECT id, v FROM b"))
    source.sql("UPDATE k SET v = 0 WHERE id = 7")
    result = drain_in_process(spark, source, lake_root, window=1 << 20, resync=["public.k"],
                              backfill_rows=100)  # fmt: skip
    assert result["backfills"]["public.k"] == {"built": True}, result["backfills"]
    merge_history(lake, history_tables(lake, True))
    rows = delta.scan(lake.paths.history(TableRef("public", "k"))).to_pylist()
    now = sorted((r["id"], r["v"], r["big"]) for r in rows if r[IS_CURRENT])
    assert now == sorted(source.sql("SELECT id, v, big FROM k"))
    resynced = [r for r in rows if r[ENDED_BY] == "resync"]
    assert len(resynced) == 30  # every version current at the copy, each once
    assert all(r[VALID_FROM_SEQ] < 0 for r in rows if r[IS_CURRENT] and r["id"] != 7)
    merge_history(lake, history_tables(lake, True))  # taken once
    again = delta.scan(lake.paths.history(TableRef("public", "k"))).num_rows
    assert again == len(rows)
