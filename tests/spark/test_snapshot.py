"""The initial snapshot against a live cluster and real Spark: exact hand-off to the drain,
no state visible before the snapshot commits (even when the process is killed between tables),
identities without a primary key, and types identical to the drain's (a job killed under the
operator: tests/operators/test_snapshot.py).

Without a server: the bootstrap plan (an existing slot is dropped only on an explicit signal or on
proof that the lake holds a killed run's snapshot of exactly that slot, never because the lake
looks empty), block ranges, and the snapshot's values stored as the drain stores them (a staged
copy published whole and once: tests/lake/test_staging.py).
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_pglogrepl.changelog.columns import described_identity, described_key
from airflow_pglogrepl.exceptions import LakeError, LakeNotEmptyError
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake import staging
from airflow_pglogrepl.lake.delta import list_tables, open_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.snapshot import (
    SnapshotCopy,
    SnapshotPoint,
    check_empty_lake,
    resolve,
    temporary_slot_name,
)
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.drain import (
    TYPED_TABLE,
    drain_app,
    drain_in_process,
    insert_sql,
    lake_table,
    random_row,
    read_delta,
    source_table,
    summary,
)
from tests.support.snapshot import snapshot_app
from tests.support.sources import Source, database_of_its_own

# The replication hook includes the snapshot statements (SnapshotMixin) itself.
SnapHook = DsnReplicationHook


@pytest.fixture
def src(publisher: PgCluster) -> Iterator[Source]:
    """A database of its own; slots are created by the tests (dropped afterwards)."""
    with database_of_its_own(publisher, "snap", "snap_pub") as source:
        yield source


def snapshot(spark: Any, source: Source, lake_root: str, **options: Any) -> dict[str, Any]:
    """Create ``source.slot`` with an exported snapshot and copy in this process's Spark."""
    hook = SnapHook(source.dsn)
    vectors = options.pop("state_deletion_vectors", None)
    with hook.create_slot_with_snapshot(source.slot) as exported:
        point = SnapshotPoint(exported.slot, exported.consistent_point, exported.snapshot_name)
        result = SnapshotCopy(
            spark=lambda: spark,
            lake=Lake(lake_root, source.slot, state_deletion_vectors=vectors),
            reader_params=hook.connection_params(),
            point=point, publications=[source.publication], **options,
        ).run()  # fmt: skip
    return result.to_dict()


# -- 1: concurrent writes, a table split across tasks, exact hand-off ---------------------------


class Writer(threading.Thread):
    """Inserts, updates (some changing the key) and deletes, one small transaction at a time."""

    def __init__(self, source: Source) -> None:
        super().__init__(daemon=True)
        self.source = source
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        next_id = itertools.count(1_000_000)
        try:
            with self.source.cluster.connect(self.source.db) as conn:
                while not self.stop.is_set():
                    with conn.transaction():
                        for _ in range(rng.randrange(1, 4)):
                            self._one(conn, rng, next_id)
                    self.transactions += 1
                    time.sleep(0.002)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    @staticmethod
    def _one(conn: Any, rng: random.Random, next_id: Iterator[int]) -> None:
        key = rng.randrange(1, 40_000)
        kind = rng.random()
        if kind < 0.3:
            conn.execute(
                "INSERT INTO big VALUES (%s, %s, md5(%s::text), %s, now())",
                (next(next_id), key % 97, key, key / 100),
            )
        elif kind < 0.55:
            conn.execute("UPDATE big SET v = 'upd ' || v, n = n + 1 WHERE id = %s", (key,))
        elif kind < 0.65:
            conn.execute("UPDATE big SET id = %s WHERE id = %s", (next(next_id), key))
        elif kind < 0.8:
            conn.execute("DELETE FROM big WHERE id = %s", (key,))
        elif kind < 0.9:
            conn.execute("UPDATE small SET v = v || '+' WHERE id = %s", (key % 500,))
        else:
            conn.execute("UPDATE typed_a SET i = %s, t = NULL WHERE id = %s", (key, key % 150))


def test_snapshot_under_concurrent_writes_hands_off_to_the_drain_exactly(
    spark: Any, src: Source, lake_uri: str
) -> None:
    src.sql(
        "CREATE TABLE big (id bigint PRIMARY KEY, grp int, v text, n numeric(12, 2),"
        " at timestamptz)"
    )
    src.sql(
        "INSERT INTO big SELECT g, g % 97, md5(g::text), g / 100.0, now() - g * interval '1 s'"
        " FROM generate_series(1, 40000) g"
    )
    src.sql("CREATE TABLE small (id int PRIMARY KEY, v text)")
    src.sql("INSERT INTO small SELECT g, 's' || g FROM generate_series(0, 499) g")
    src.sql(TYPED_TABLE.format(name="typed_a"))
    rng = random.Random(20261122)
    for key in range(150):
        src.sql(insert_sql("typed_a"), random_row(rng, key, big=key % 10 == 0))
    src.sql("CREATE TABLE empty_e (id int PRIMARY KEY, v text)")
    src.sql("ANALYZE")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE big, small, typed_a, empty_e")
    lake_root = lake_uri

    writer = Writer(src)
    writer.start()
    try:
        time.sleep(0.3)
        before = writer.transactions
        result = snapshot(spark, src, lake_root, tasks_per_table=4, rows_per_task=10_000)
        during = writer.transactions - before
        time.sleep(0.5)
    finally:
        writer.stop.set()
        writer.join(timeout=30)
    assert writer.error is None, writer.error
    assert during > 20, "the writer must have committed while the snapshot ran"
    assert result["committed"] and result["tables"]["public.big"]["tasks"] == 4, result
    assert result["tables"]["public.empty_e"]["rows"] == 0

    lake = Lake(lake_root, src.slot)
    (record,) = lake.windows()
    assert record["kind"] == "snapshot" and record["slot"] == src.slot
    assert record["start_lsn"] == record["end_lsn"] == result["consistent_point"]
    assert json.loads(record["tables"])["public.big"] == result["tables"]["public.big"]["rows"]
    assert lake.position() == LSN(result["consistent_point"])
    # the slot starts exactly at the snapshot: the drain reconciles without a gap or a jump
    assert src.hook().get_slot(src.slot).confirmed_flush_lsn == LSN(result["consistent_point"])
    with pytest.raises(LakeNotEmptyError):
        check_empty_lake(lake)

    drained = drain_in_process(spark, src, lake_root, window=1 << 20)
    assert drained["changes"] > 0
    assert drained["window_start_lsn"] == result["consistent_point"]
    for table in ("big", "small", "typed_a", "empty_e"):
        assert lake_table(lake_root, table) == source_table(src, table), table
        assert lake.state_version(TableRef("public", table)) is not None, table


# -- 2: the two ways of copying give the lake the same tables ------------------------------------


def test_a_copy_in_process_and_one_on_spark_give_the_same_tables(
    spark: Any, src: Source, tmp_path: Path
) -> None:
    """The same snapshot copied by this process and by Spark: every state table has the same
    rows and types, the same protocol (deletion vectors, ``timestampNtz``, column mapping for a
    name Delta cannot store as it is), the same properties and the same schema with the lake's
    metadata (the key, the source name, the attribute number); and a drain merges into both
    alike. A lake without deletion vectors gets none either way."""
    src.sql(TYPED_TABLE.format(name="typed"))
    rng = random.Random(43)
    for key in range(1, 121):
        src.sql(insert_sql("typed"), random_row(rng, key, big=key % 11 == 0))
    src.sql('CREATE TABLE odd ("a,b" int, "Id" int NOT NULL PRIMARY KEY, "x y" text)')
    src.sql("INSERT INTO odd SELECT g, g, 'v' || g FROM generate_series(1, 5000) g")
    src.sql("CREATE TABLE nokey (a int, b text)")
    src.sql("ALTER TABLE nokey REPLICA IDENTITY FULL")
    src.sql("INSERT INTO nokey VALUES (1, 'dup'), (1, 'dup'), (NULL, NULL)")
    src.sql("CREATE TABLE empty_e (id int PRIMARY KEY)")
    src.sql("ANALYZE")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE typed, odd, nokey, empty_e")
    tables = ("typed", "odd", "nokey", "empty_e")
    lakes = {}
    for engine, vectors in (("spark", True), ("process", True), ("spark", False),
                            ("process", False)):  # fmt: skip
        one = Source(src.cluster, src.db, f"{src.slot}_{engine}_{int(vectors)}", src.publication)
        root = str(tmp_path / f"{engine}-{vectors}")
        result = snapshot(spark, one, root, engine=engine, tasks_per_table=3, rows_per_task=1000,
                          state_deletion_vectors=vectors)  # fmt: skip
        assert {t["engine"] for t in result["tables"].values()} == {engine}, result
        assert result["tables"]["public.odd"]["tasks"] == 3, result
        lakes[engine, vectors] = (one, root)
    for vectors in (True, False):
        (_, on_spark), (_, in_process) = lakes["spark", vectors], lakes["process", vectors]
        for table in tables:
            assert _first_entry(in_process, table) == _first_entry(on_spark, table), table
            assert _arrow_state(in_process, table) == _arrow_state(on_spark, table), table
        # the key's bounds are in each file's statistics, as Spark records them (under the
        # physical name when mapped): readers skip files by them
        for root in (on_spark, in_process):
            assert _key_bounds(root, "typed", "id") == (1, 120), root
            assert _key_bounds(root, "odd", "Id") == (1, 5000), root
        # Review finding: Spark made a mapped table without vectors in a form (reader 2)
        # that deltalake's pyarrow reader read as NULLs, without an error; now it refuses it
        for root in (on_spark, in_process):
            state = DeltaTable(str(Path(root, "state", "public.odd")))
            assert "columnMapping" in (state.protocol().reader_features or []), root
    src.sql("UPDATE typed SET t = 'changed', i = NULL WHERE id % 3 = 0")
    src.sql('DELETE FROM odd WHERE "Id" % 7 = 0')
    src.sql('UPDATE odd SET "x y" = \'upd\' WHERE "Id" % 5 = 0')
    src.sql("DELETE FROM nokey WHERE a IS NULL")
    for one, root in (lakes["spark", True], lakes["process", True]):
        drain_in_process(spark, one, root, window=1 << 20, small_rows=0)  # Spark's MERGE
        for table in tables:
            assert lake_table(root, table) == source_table(src, table), (root, table)


def _key_bounds(lake_root: str, table: str, column: str) -> tuple[int, int]:
    """The lowest minimum and highest maximum of ``column`` over the files of version 0."""
    state = Path(lake_root, "state", table_dir(TableRef("public", table)))
    lines = (state / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
    actions = [json.loads(line) for line in lines]
    meta = next(a["metaData"] for a in actions if "metaData" in a)
    field = next(f for f in json.loads(meta["schemaString"])["fields"] if f["name"] == column)
    stored = field["metadata"].get("delta.columnMapping.physicalName", column)
    stats = [json.loads(a["add"]["stats"]) for a in actions if "add" in a]
    return (min(s["minValues"][stored] for s in stats), max(s["maxValues"][stored] for s in stats))


def _first_entry(lake_root: str, table: str) -> dict[str, Any]:
    """What a state table's version 0 says of it, without what differs between any two
    (ids, times, file names and sizes, the writer's own commit information)."""
    state = Path(lake_root, "state", table_dir(TableRef("public", table)))
    lines = (state / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
    actions = [json.loads(line) for line in lines]
    meta = next(a["metaData"] for a in actions if "metaData" in a)
    schema = json.loads(meta["schemaString"])
    for field in schema["fields"]:  # physical names are fresh uuids either way
        field["metadata"].pop("delta.columnMapping.physicalName", None)
    protocol = next(a["protocol"] for a in actions if "protocol" in a)
    return {
        # a set of features: their order says nothing
        "protocol": {k: sorted(v) if isinstance(v, list) else v for k, v in protocol.items()},
        "configuration": meta["configuration"],
        "partitionColumns": meta["partitionColumns"],
        "schema": schema,
        "txns": sum(1 for a in actions if "txn" in a),  # the lake's, at the consistent point
        "rows": sum(json.loads(a["add"]["stats"])["numRecords"] for a in actions if "add" in a),
    }


# -- 2b: the application killed between tables: no reader sees a snapshot that never committed --


@pytest.mark.spark
def test_a_snapshot_killed_between_tables_leaves_no_state_and_a_rerun_is_exact(
    src: Source, lake_uri: str
) -> None:
    """The application dies as under SIGKILL (nothing of it runs on) after its first table is
    copied: no state table is readable, what it left is reported at the slot's position, and
    after a second death in the middle of publishing, a third run removes what both left and
    commits exactly the source."""
    for name, rows in (("a", 3000), ("b", 2000), ("c", 1000)):
        src.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        src.sql(f"INSERT INTO {name} SELECT g, md5(g::text) FROM generate_series(1, {rows}) g")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE a, b, c")
    lake_root = lake_uri
    state = f"{lake_root}/state"
    lake = Lake(lake_root, src.slot)
    # one table at a time, so the first death comes with exactly one table copied
    args = ("--parallelism", "1", "--tasks-per-table", "2", "--rows-per-task", "1000")

    killed = snapshot_app(src, lake_root, *args, fault="table_copied")
    assert killed.returncode == 137, killed.stderr[-3000:]
    left_at = src.hook().get_slot(src.slot).confirmed_flush_lsn  # the slot is left behind
    assert list_tables(state) == []
    for name in ("a", "b", "c"):
        assert open_table(f"{state}/public.{name}") is None
    assert lake.position() is None
    assert staging.staged_points(state) == [left_at]  # the first table was copied, staged
    assert resolve(lake)["uncommitted_snapshots"] == [str(left_at)]
    # A drain now would leave the tables the snapshot never reached empty: refused.
    refused = drain_app(src, lake_root)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "LakeSnapshotUnfinishedError" in refused.stderr and str(left_at) in refused.stderr
    assert src.hook().get_slot(src.slot).confirmed_flush_lsn == left_at
    assert lake.position() is None and lake.changes_tables() == [] and list_tables(state) == []

    # Killed again after publishing its first table: that one is readable, nothing commits.
    src.sql("UPDATE b SET v = 'between' WHERE id <= 50")
    published = snapshot_app(src, lake_root, *args, "--replace-slot", fault="table_published")
    assert published.returncode == 137, published.stderr[-3000:]
    left_at = src.hook().get_slot(src.slot).confirmed_flush_lsn
    assert list_tables(state) == ["public.a"] and lake.position() is None
    assert resolve(lake)["uncommitted_snapshots"] == [str(left_at)]

    src.sql("DELETE FROM c WHERE id % 3 = 0")
    done = summary(snapshot_app(src, lake_root, *args, "--replace-slot"))
    point = LSN(done["consistent_point"])
    assert done["committed"] and lake.position() == point, done
    assert list_tables(state) == ["public.a", "public.b", "public.c"]
    assert resolve(lake)["uncommitted_snapshots"] == []
    for name in ("a", "b", "c"):
        assert lake_table(lake_root, name) == source_table(src, name), name
        assert lake.state_version(TableRef("public", name)) == point
        # the earlier runs' copies are gone; this one's files stay where they were staged
        assert entries(f"{state}/public.{name}") == ["_delta_log", f"snapshot-{int(point):016X}"]
        assert entries(f"{state}/public.{name}/snapshot-{int(point):016X}/_delta_log") == []


# -- 3: identities without a primary key; types identical to the drain's ----------------------


def test_identity_full_and_unique_index_and_types_equal_the_drains(
    spark: Any, src: Source, tmp_path: Path
) -> None:
    plain = Source(src.cluster, src.db, f"{src.slot}_plain", src.publication)
    src.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (plain.slot,))
    src.sql("CREATE TABLE nokey (a int, b text)")
    src.sql("ALTER TABLE nokey REPLICA IDENTITY FULL")
    src.sql("CREATE TABLE uidx (code text NOT NULL, n int NOT NULL, v text, d date)")
    src.sql("CREATE UNIQUE INDEX uidx_code_n ON uidx (code, n)")
    src.sql("ALTER TABLE uidx REPLICA IDENTITY USING INDEX uidx_code_n")
    src.sql(TYPED_TABLE.format(name="typed"))
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE nokey, uidx, typed")
    src.sql("INSERT INTO nokey VALUES (1, 'dup'), (1, 'dup'), (1, 'dup'), (2, NULL), (NULL, 'x')")
    src.sql("INSERT INTO uidx SELECT 'c' || (g % 7), g, 'v' || g, date '2024-01-01' + g"
            " FROM generate_series(1, 300) g")  # fmt: skip
    rng = random.Random(5)
    for key in range(1, 81):
        src.sql(insert_sql("typed"), random_row(rng, key, big=key % 9 == 0))

    snap_lake, drain_lake = str(tmp_path / "snap"), str(tmp_path / "drained")
    result = snapshot(spark, src, snap_lake)
    assert result["tables"]["public.nokey"]["rows"] == 5
    (record,) = Lake(snap_lake, src.slot).windows()
    assert json.loads(record["tables"])["public.uidx"] == 300

    # after the snapshot: one of three identical rows goes, another changes; keys move
    src.sql("DELETE FROM nokey WHERE ctid = (SELECT min(ctid) FROM nokey WHERE a = 1)")
    src.sql("UPDATE nokey SET b = 'one' WHERE ctid = (SELECT max(ctid) FROM nokey WHERE a = 1)")
    src.sql("UPDATE uidx SET n = n + 1000 WHERE n % 10 = 0")
    src.sql("UPDATE uidx SET v = NULL, d = NULL WHERE n % 3 = 0")
    src.sql("DELETE FROM uidx WHERE n % 17 = 0")
    src.sql("UPDATE typed SET i = 1, t = 'changed' WHERE id % 4 = 0")  # big stays unchanged
    src.sql("DELETE FROM typed WHERE id % 5 = 0")
    drain_in_process(spark, src, snap_lake, window=1 << 20)
    drain_in_process(spark, plain, drain_lake, window=1 << 20)  # the same rows, all drained
    # the changelog's schema carries the identity the merge used (FULL: every column is key)
    for table, key, identity in (("uidx", ["code", "n"], "i"), ("nokey", ["a", "b"], "f")):
        fields = read_delta(Path(snap_lake) / "changes" / f"public.{table}").schema
        described = [(f.name, _text(f.metadata)) for f in fields]
        assert described_key(described) == key and described_identity(described) == identity
    for table in ("nokey", "uidx", "typed"):
        assert lake_table(snap_lake, table) == source_table(src, table), table
        assert _arrow_state(snap_lake, table) == _arrow_state(drain_lake, table), table

    # a table published later is re-snapshotted alone, in a temporary slot's snapshot
    src.sql("CREATE TABLE late (id int PRIMARY KEY, v text)")
    src.sql("INSERT INTO late SELECT g, 'l' || g FROM generate_series(1, 1000) g")
    src.sql(f"ALTER PUBLICATION {src.publication} ADD TABLE late")
    src.sql("UPDATE late SET v = 'before snapshot' WHERE id <= 10")  # drained and in the copy
    hook = SnapHook(src.dsn)
    with hook.create_slot_with_snapshot(temporary_slot_name(src.slot), temporary=True) as held:
        src.sql("UPDATE late SET v = 'after snapshot' WHERE id <= 5")  # drained only
        SnapshotCopy(
            spark=lambda: spark, lake=Lake(snap_lake, src.slot),
            reader_params=hook.connection_params(), publications=[src.publication],
            point=SnapshotPoint(src.slot, held.consistent_point, held.snapshot_name),
            tables=[TableRef("public", "late")],
        ).run()  # fmt: skip
    src.sql("DELETE FROM late WHERE id > 990")
    src.sql("UPDATE uidx SET v = 'still drained' WHERE n = 1")
    drain_in_process(spark, src, snap_lake, window=1 << 20)
    for table in ("late", "uidx"):
        assert lake_table(snap_lake, table) == source_table(src, table), table


def test_a_lake_without_deletion_vectors_is_snapshotted_and_merged_without_them(
    spark: Any, src: Source, tmp_path: Path
) -> None:
    """The snapshot creates the state as the lake was told (no vectors, no reader feature), and
    the drain after it, told nothing, follows the lake's record: Spark's merge of updates and
    deletes leaves a table ``DeltaTable.to_pandas()`` reads, equal to the source."""
    src.sql("CREATE TABLE plain (id int PRIMARY KEY, v text)")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE plain")
    src.sql("INSERT INTO plain SELECT g, 'v' || g FROM generate_series(1, 2000) g")
    lake_root = str(tmp_path / "lake")
    hook = SnapHook(src.dsn)
    with hook.create_slot_with_snapshot(src.slot) as exported:
        point = SnapshotPoint(exported.slot, exported.consistent_point, exported.snapshot_name)
        SnapshotCopy(
            spark=lambda: spark, lake=Lake(lake_root, src.slot, state_deletion_vectors=False),
            reader_params=hook.connection_params(), point=point, publications=[src.publication],
        ).run()  # fmt: skip
    state = Path(lake_root, "state", "public.plain")
    assert DeltaTable(str(state)).protocol().reader_features is None
    src.sql("UPDATE plain SET v = 'changed' WHERE id % 3 = 0")
    src.sql("DELETE FROM plain WHERE id % 7 = 0")
    drain_in_process(spark, src, lake_root, window=1 << 20, small_rows=0)  # Spark's MERGE
    log = "".join(p.read_text() for p in sorted(Path(state, "_delta_log").glob("*.json")))
    assert '"deletionVector":{' not in log
    frame = DeltaTable(str(state)).to_pandas()
    rows = [(int(i), v) for i, v in zip(frame["id"], frame["v"], strict=True)]
    assert sorted(rows, key=repr) == source_table(src, "plain")


@pytest.mark.pgversion
def test_the_task_reads_hostile_names_in_the_snapshot_through_adbc_and_fails_cleanly(
    src: Source, tmp_path: Path
) -> None:
    """One Spark task's read, without Spark: quotes, a semicolon, a backslash and unicode in
    the schema, table and column names and the row filter; ranges of heap blocks that add up to
    the table; rows written after the snapshot unseen. A snapshot that is gone, or a wrong
    password, is ``SnapshotReadError`` naming the table, and never the password."""
    from airflow_pglogrepl.exceptions import ConnectionFailedError, SnapshotReadError
    from airflow_pglogrepl.postgres.passfile import travelling_params
    from airflow_pglogrepl.postgres.snapshot import SnapshotReader
    from airflow_pglogrepl.spark.range_copy import BlockRange, CopyTask

    table = '"Sch; ema"."Tab ""le"" é"'
    src.sql('CREATE SCHEMA "Sch; ema"')
    src.sql(f'CREATE TABLE {table} (id int PRIMARY KEY, "co""l\\é" text, at timestamptz)')
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE {table}"
            f' WHERE ("co""l\\é" <> \'sk;ip\') WITH (publish = \'insert\')')  # fmt: skip
    src.sql(f"INSERT INTO {table} SELECT g, CASE WHEN g % 10 = 0 THEN 'sk;ip' ELSE 'v' || g END,"
            f" timestamptz '2026-01-01 00:00+00' + g * interval '1 s'"
            f" FROM generate_series(1, 3000) g")  # fmt: skip
    hook = SnapHook(src.dsn)
    params = hook.connection_params()
    with hook.create_slot_with_snapshot(src.slot) as held:
        src.sql(f"INSERT INTO {table} VALUES (5000, 'after', NULL)")
        reader = SnapshotReader(params)
        with reader.transaction(held.snapshot_name) as conn:
            (info,) = reader.published_tables(conn, [src.publication])
        assert info.row_filter is not None and info.blocks > 2
        with travelling_params(params) as task_params:
            task = CopyTask(task_params, held.snapshot_name, info)
            middle = info.blocks // 2
            rows = [
                row
                for block_range in (BlockRange(0, middle), BlockRange(middle, None))
                for batch in task.copy(block_range)
                for row in batch.to_pylist()
            ]
        stale = held.snapshot_name
    assert sorted(r["id"] for r in rows) == [g for g in range(1, 3001) if g % 10]
    row = next(r for r in rows if r["id"] == 7)
    assert row['co"l\\é'] == "v7" and str(row["at"]) == "2026-01-01 00:00:07+00:00"

    password = params["password"]
    with (
        travelling_params(params) as task_params,
        pytest.raises(SnapshotReadError, match=r'Tab ""le"" é.*no longer exists.*again') as gone,
    ):
        list(CopyTask(task_params, stale, info).copy(BlockRange(0, None)))
    wrong = {**params, "password": "not-" + password}
    with (
        travelling_params(wrong) as task_params,
        pytest.raises((SnapshotReadError, ConnectionFailedError)) as refused,
    ):
        list(CopyTask(task_params, stale, info).copy(BlockRange(0, None)))
    for failure in (gone.value, refused.value):
        assert password not in str(failure) and "not-" + password not in str(failure)

    # a table without columns would lose its rows in Parquet: refused before any copy
    src.sql('CREATE TABLE "Sch; ema".nocols ()')
    src.sql('INSERT INTO "Sch; ema".nocols DEFAULT VALUES')
    src.sql(f'ALTER PUBLICATION {src.publication} ADD TABLE "Sch; ema".nocols')
    lake_root = tmp_path / "lake"
    with hook.create_slot_with_snapshot(f"{src.slot}_nc", temporary=True) as held:
        point = SnapshotPoint(held.slot, held.consistent_point, held.snapshot_name)
        copy = SnapshotCopy(spark=None, lake=Lake(str(lake_root), held.slot), reader_params=params,
                            point=point, publications=[src.publication])  # fmt: skip
        with pytest.raises(LakeError, match=r"nocols publishes no columns.*Nothing was copied"):
            copy.run()
    assert not lake_root.exists() or not any(lake_root.rglob("*.parquet"))


def _text(metadata: dict[bytes, bytes] | None) -> dict[str, str] | None:
    return {k.decode(): v.decode() for k, v in metadata.items()} if metadata else None


def _arrow_state(lake_root: str, table: str) -> tuple[str, list[dict[str, Any]]]:
    """A table's state as Arrow sees it: exact types and values, in a stable order.

    Field metadata (the lake's own bookkeeping, such as each column's source type) is left
    out: the comparison is about what a reader gets.
    """
    data = read_delta(Path(lake_root) / "state" / table_dir(TableRef("public", table)))
    rows = sorted(data.to_pylist(), key=repr)
    types = ", ".join(f"{f.name}: {f.type}" for f in data.schema)
    return types, rows


def test_a_snapshot_into_another_slots_lake_is_refused_before_it_is_judged_or_cleaned(
    tmp_path: Path,
) -> None:
    """Review finding: the snapshot judged the lake by its contents first, and its advice
    ("move changes/ away") would have destroyed the other slot's lake."""

    from airflow_pglogrepl.exceptions import LakeOfAnotherSlotError

    root = str(tmp_path / "lake")
    owner = Lake(root, "a")
    owner.claim({"system_identifier": "7", "database_oid": 5}, publications=["p"],
                began_with="drain")  # fmt: skip
    window = Window(owner, LSN(0x100))
    rows = pa.table({"id": pa.array([1], pa.int64()), "_commit_lsn": pa.array([0x110], pa.int64()),
                     "_seq": pa.array([1], pa.int64())})  # fmt: skip
    window.write(TableRef("public", "t"), rows)
    window.commit(LSN(0x200), transactions=1, changes=1)
    point = SnapshotPoint("b", LSN(0x500), "snap")
    copy = SnapshotCopy(spark=None, lake=Lake(root, "b"), reader_params={}, point=point,
                        publications=["p"])  # fmt: skip
    with pytest.raises(LakeOfAnotherSlotError, match=r"belongs to slot 'a'"):
        copy.run()
    assert owner.changes_tables() == ["public.t"] and owner.position() == LSN(0x200)


def entries(uri: str) -> list[str]:
    """The names directly under a lake folder, local or in a bucket (an object store has no
    empty folder: none is an empty list there, as a missing one is here)."""
    from pyarrow import fs

    from airflow_pglogrepl.lake import storage

    system, base = storage.filesystem(uri)
    found = system.get_file_info(fs.FileSelector(base, allow_not_found=True))
    return sorted(info.base_name for info in found)
