"""Any PostgreSQL column name, end to end against a live cluster and real Spark: a snapshot, the
drain (insert, update, delete) and both merges store every column under its lake name, and the
state equals the source value by value, read through Spark, ``deltalake`` and polars. A plain
table beside it keeps a plain schema, and one that gains such a name is turned to column
mapping in place, its history kept."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.mapping import is_mapped
from airflow_pglogrepl.spark.snapshot import SnapshotCopy, SnapshotPoint
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.drain import drain_in_process, normalize, read_delta, source_table
from tests.support.sources import Source

pytestmark = pytest.mark.spark

LONG = "l" * 63  # PostgreSQL's longest name
# source name -> lake name: two names Delta takes for one get a suffix, and so does a column
# named like one of the changelog's own
COLUMNS = {
    "id": "id",
    "sp ace": "sp ace",
    "a=b": "a=b",
    "x(y)": "x(y)",
    "Name": "Name",
    "name": "name__2",
    "tab\there": "tab\there",
    "naïve 名": "naïve 名",
    LONG: LONG,
    "_op": "_op__2",
}
HOSTILE = TableRef("public", "hostile")


@pytest.fixture
def src(publisher: PgCluster) -> Iterator[Source]:
    """A database of its own; the slot is created by the snapshot (dropped afterwards)."""
    publisher.create_database("names_1")
    source = Source(publisher, "names_1", "names_slot", "names_pub")
    yield source
    source.sql("SELECT pg_drop_replication_slot('names_slot') FROM pg_replication_slots "
               "WHERE slot_name = 'names_slot'")  # fmt: skip
    publisher.execute("DROP DATABASE names_1")


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def source_rows(src: Source) -> list[tuple[Any, ...]]:
    listed = ", ".join(quoted(c) for c in COLUMNS)
    return sorted(tuple(normalize(v) for v in row)
                  for row in src.sql(f"SELECT {listed} FROM hostile"))  # fmt: skip


def state_by_reader(spark: Any, lake_root: str) -> dict[str, list[tuple[Any, ...]]]:
    """The state of ``hostile`` under its lake names, as each reader reads it."""
    import polars as pl

    path = f"{lake_root}/state/public.hostile"
    wanted = list(COLUMNS.values())

    def rows(table: pa.Table) -> list[tuple[Any, ...]]:
        return sorted(tuple(normalize(r[c]) for c in wanted) for r in table.to_pylist())

    frame = spark.read.format("delta").load(path)
    spark_rows = sorted(tuple(normalize(r[c]) for c in wanted) for r in frame.collect())
    # polars cannot open a column-mapped table itself: read through delta-rs (docs/drain.md)
    polars = pl.from_arrow(pa.RecordBatchReader.from_stream(opened(path).scan()))
    assert isinstance(polars, pl.DataFrame)
    return {"spark": spark_rows, "deltalake": rows(read_delta(path)),
            "polars": rows(polars.to_arrow())}  # fmt: skip


def test_every_name_through_snapshot_drain_and_both_merges(
    spark: Any, src: Source, lake_uri: str
) -> None:
    columns = ", ".join(f"{quoted(c)} {'int PRIMARY KEY' if c == 'id' else 'text'}"
                        for c in COLUMNS)  # fmt: skip
    src.sql(f"CREATE TABLE hostile ({columns})")
    src.sql("CREATE TABLE plain (id int PRIMARY KEY, v text)")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE hostile, plain")
    listed = ", ".join(quoted(c) for c in COLUMNS)
    values = ", ".join(f"'{i}' || g" for i in range(1, len(COLUMNS)))

    def insert(first: int, last: int) -> None:
        src.sql(f"INSERT INTO hostile ({listed}) "
                f"SELECT g, {values} FROM generate_series({first}, {last}) g")  # fmt: skip
        src.sql(f"INSERT INTO plain SELECT g, 'v' || g FROM generate_series({first}, {last}) g")

    insert(1, 50)
    lake_root = lake_uri
    hook = DsnReplicationHook(src.dsn)
    with hook.create_slot_with_snapshot(src.slot) as exported:
        done = SnapshotCopy(
            spark=lambda: spark, lake=Lake(lake_root, src.slot),
            reader_params=hook.connection_params(),
            point=SnapshotPoint(exported.slot, exported.consistent_point, exported.snapshot_name),
            publications=[src.publication],
        ).run()  # fmt: skip
    assert done.to_dict()["columns_stored_as"] == {
        "public.hostile": {"name": "name__2", "_op": "_op__2"}
    }
    state = opened(f"{lake_root}/state/public.hostile")
    assert is_mapped(state) and not is_mapped(opened(f"{lake_root}/state/public.plain"))
    assert [f.name for f in state.schema().fields] == list(COLUMNS.values())

    def changes(first: int) -> None:
        insert(first, first + 9)
        src.sql('UPDATE hostile SET "sp ace" = NULL, name = \'upd\', "_op" = \'o\', '
                f'"tab\there" = \'t\' WHERE id % 3 = 0 AND id < {first}')  # fmt: skip
        src.sql(f"DELETE FROM hostile WHERE id % 7 = 0 AND id < {first}")
        src.sql(f"UPDATE plain SET v = 'p' WHERE id < {first}")

    changes(51)
    drain_in_process(spark, src, lake_root, window=1 << 30)  # merged without a JVM
    assert {k: v == source_rows(src) for k, v in state_by_reader(spark, lake_root).items()} == {
        "spark": True, "deltalake": True, "polars": True,
    }  # fmt: skip
    changes(61)
    drain_in_process(spark, src, lake_root, window=1 << 30, small_rows=0)  # merged by Spark
    for reader, rows in state_by_reader(spark, lake_root).items():
        assert rows == source_rows(src), reader
    plain = read_delta(f"{lake_root}/state/public.plain").to_pylist()
    assert sorted((r["id"], r["v"]) for r in plain) == sorted(source_table(src, "plain"))
    changelog = opened(f"{lake_root}/changes/public.hostile")
    assert is_mapped(changelog)
    assert {"name__2", "_op__2"} <= {f.name for f in changelog.schema().fields}


def test_a_plain_table_that_gains_such_a_name_is_mapped_in_place(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """The changelog and the state are turned to column mapping by the run that first sees the
    column, their earlier rows kept; both merges then carry it."""
    source.sql("CREATE TABLE grows (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE grows")
    source.sql("INSERT INTO grows SELECT g, 'v' || g FROM generate_series(1, 20) g")
    lake_root = str(tmp_path / "lake")
    drain_in_process(spark, source, lake_root, window=1 << 30)
    ref = TableRef("public", "grows")
    assert not is_mapped(opened(f"{lake_root}/state/public.grows"))
    source.sql('ALTER TABLE grows ADD COLUMN "first name" text')
    source.sql("INSERT INTO grows VALUES (21, 'v21', 'f21')")
    source.sql("UPDATE grows SET \"first name\" = 'f' || id WHERE id <= 5")
    drain_in_process(spark, source, lake_root, window=1 << 30, small_rows=0)
    source.sql("UPDATE grows SET \"first name\" = 'g' || id WHERE id > 15")
    drain_in_process(spark, source, lake_root, window=1 << 30)
    for kind in ("changes", "state"):
        assert is_mapped(opened(f"{lake_root}/{kind}/public.grows")), kind
    got = sorted((r["id"], r["v"], r["first name"]) for r in
                 read_delta(f"{lake_root}/state/public.grows").to_pylist())  # fmt: skip
    assert got == sorted(source.sql('SELECT id, v, "first name" FROM grows'))
    # the history from before the column: still there, under the same names
    history = read_delta(f"{lake_root}/changes/public.grows").to_pylist()
    assert sum(r["_commit_lsn"] is not None and r["first name"] is None for r in history) >= 20
    assert Lake(lake_root, source.slot).changes_version(ref) is not None


def test_a_rename_at_the_source_is_a_rename_in_the_lake(
    spark: Any, source: Source, lake_uri: str
) -> None:
    """Renames between windows and inside one, of a TOASTed column (whose unchanged values
    rows from before the rename name as it was) and of the key: the history stays in
    ``changes/``, the values in ``state/``, both merges agree with the source, and no
    re-snapshot is needed. A column later added under a former name is another column."""
    source.sql("CREATE TABLE r (id int PRIMARY KEY, b text, big text)")
    source.sql("ALTER TABLE r ALTER COLUMN big SET STORAGE EXTERNAL")  # stored out of line
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE r")
    source.sql("INSERT INTO r SELECT g, 'b' || g, (SELECT string_agg(md5(g::text || x::text), "
               "'') FROM generate_series(1, 200) x) FROM generate_series(1, 8) g")  # fmt: skip
    lake_root = lake_uri
    drain_in_process(spark, source, lake_root, window=1 << 30)

    def state_equals_source(columns: str) -> None:
        names = [c.strip().strip('"') for c in columns.split(", ")]
        got = sorted(tuple(r[n] for n in names) for r in
                     read_delta(f"{lake_root}/state/public.r").to_pylist())  # fmt: skip
        assert got == sorted(source.sql(f"SELECT {columns} FROM r")), columns

    # between windows (a window per transaction), merged without a JVM
    source.sql("UPDATE r SET b = 'u1' WHERE id = 1")  # big unchanged: named "big" in the row
    source.sql("ALTER TABLE r RENAME COLUMN big TO huge")
    source.sql("UPDATE r SET b = 'u2' WHERE id = 2")
    drain_in_process(spark, source, lake_root, window=1)
    state_equals_source("id, b, huge")
    # inside one window, the key and a column, merged by Spark
    source.sql("UPDATE r SET b = 'u3' WHERE id = 3")
    source.sql("ALTER TABLE r RENAME COLUMN b TO c")
    source.sql('ALTER TABLE r RENAME COLUMN huge TO "hu ge"')  # u3's row names it "huge"
    source.sql("ALTER TABLE r RENAME COLUMN id TO ident")
    source.sql("UPDATE r SET c = 'u4' WHERE ident = 4")
    source.sql("DELETE FROM r WHERE ident = 5")
    drain_in_process(spark, source, lake_root, window=1 << 30, small_rows=0)
    state_equals_source('ident, c, "hu ge"')
    history = read_delta(f"{lake_root}/changes/public.r")
    assert {"id", "b", "big", "huge"}.isdisjoint(history.column_names)
    assert sorted(r["c"] for r in history.to_pylist() if r["ident"] == 1) == ["b1", "u1"]
    spark_state = spark.read.format("delta").load(f"{lake_root}/state/public.r")
    assert sorted(spark_state.columns) == ["c", "hu ge", "ident"]
    # a column added under a former name is another column
    source.sql("ALTER TABLE r ADD COLUMN big text")
    source.sql("UPDATE r SET big = 'new' WHERE ident = 6")
    drain_in_process(spark, source, lake_root, window=1 << 30)
    got = {r["ident"]: (r["big__2"], len(r["hu ge"])) for r in
           read_delta(f"{lake_root}/state/public.r").to_pylist()}  # fmt: skip
    assert got[6] == ("new", 6400) and got[7] == (None, 6400)


def opened(uri: str) -> Any:
    """The ``deltalake.DeltaTable`` at ``uri``, on a path or in a bucket."""
    from airflow_pglogrepl.lake.delta import open_table

    table = open_table(uri)
    assert table is not None, uri
    return table
