"""A table created under Delta column mapping holds any PostgreSQL column name, nested ones (a
changelog's ``_old``) included, and is read under those names by delta-rs' query engine and by
Spark; deltalake's pyarrow reader refuses it rather than reading NULLs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.columns import META_COLUMNS
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.mapping import PHYSICAL_KEY, is_mapped, mapped_schema, to_physical
from tests.support.mapped_tables import HOSTILE, create_mapped, hostile_rows


def test_every_name_reads_back_under_itself_without_a_jvm(tmp_path: Path) -> None:
    uri, rows = create_mapped(tmp_path)
    back = delta.read_table(uri).select(rows.column_names)
    assert back.column_names == rows.column_names
    assert back.to_pylist() == rows.to_pylist()
    table = delta.open_table(uri)
    assert table is not None
    protocol = table.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "columnMapping" in (protocol.reader_features or [])
    with pytest.raises(Exception):  # noqa: B017 - refused (any error), never a table of NULLs
        table.to_pyarrow_table()


def test_the_files_hold_physical_names_and_the_lsn_column_keeps_its_own(tmp_path: Path) -> None:
    import json

    import pyarrow.parquet as pq

    uri, _ = create_mapped(tmp_path)
    [path] = [p for p in Path(uri).glob("*.parquet")]
    names = pq.read_schema(path).names
    assert "_commit_lsn" in names and "_old" in names
    assert not set(HOSTILE) & set(names) and all(n.startswith("col-") for n in names[:8])
    table = delta.open_table(uri)
    assert table is not None
    fields = json.loads(table.schema().to_json())["fields"]
    old = next(f for f in fields if f["name"] == "_old")
    assert [f["name"] for f in old["type"]["fields"]] == ["sp ace", "a=b"]
    assert all(f["metadata"][PHYSICAL_KEY].startswith("col-") for f in old["type"]["fields"])


def test_a_slice_and_several_chunks_keep_their_rows(tmp_path: Path) -> None:
    rows = pa.concat_tables([hostile_rows().slice(1), hostile_rows()])
    mapped = mapped_schema(rows.schema, pinned=META_COLUMNS)
    physical = to_physical(rows, mapped)
    assert physical.num_rows == rows.num_rows
    uri = str(tmp_path / "t")
    delta.create_table(uri, rows.schema, [delta.write_file(uri, physical, "p")], app="a",
                       version=1, configuration={}, mapping=mapped)  # fmt: skip
    assert delta.read_table(uri).select(rows.column_names).to_pylist() == rows.to_pylist()


@pytest.mark.spark
def test_spark_reads_every_name(tmp_path: Path, spark: object) -> None:
    uri, rows = create_mapped(tmp_path)
    frame = spark.read.format("delta").load(uri)  # type: ignore[attr-defined]
    assert frame.columns == rows.column_names
    got = sorted(frame.select("`sp ace`", "`a=b`", "`x(y)`", "_old.`a=b`").collect(), key=str)
    assert [tuple(r) for r in got] == sorted([(1, 1, 1, 8), (2, 2, 2, None), (None, None, None, 9)],
                                             key=str)  # fmt: skip


def _state(ids: list[int], tag: str) -> pa.Table:
    return pa.table({"id key": pa.array(ids, pa.int64()),
                     "a=b": pa.array([f"{tag}{i}" for i in ids], pa.string())})  # fmt: skip


def test_windows_append_to_a_mapped_table_through_the_commit_path(tmp_path: Path) -> None:
    """The first commit creates the mapped table, later ones append physical files to it,
    each a compare-and-set on the app's transaction as for any table."""
    from airflow_pglogrepl.exceptions import LakeCommitConflictError
    from airflow_pglogrepl.lake.mapping import mapped_of

    uri = str(tmp_path / "t")
    first = _state([1, 2], "v")
    mapped = mapped_schema(first.schema)
    file = delta.write_file(uri, to_physical(first, mapped), "w1")
    delta.commit_files(uri, first.schema, [file], app="a", version=1, expected=None,
                       mapping=mapped)  # fmt: skip
    table = delta.open_table(uri)
    assert table is not None and is_mapped(table)
    again = mapped_of(table)  # the physical names come from the table, not recomputed
    assert again is not None and again.schema == mapped.schema
    second = _state([3], "w")
    file = delta.write_file(uri, to_physical(second, again), "w2")
    with pytest.raises(LakeCommitConflictError):
        delta.commit_files(uri, second.schema, [file], app="a", version=2, expected=None)
    delta.commit_files(uri, second.schema, [file], app="a", version=2, expected=1)
    assert delta.txn_version(uri, "a") == 2
    assert sorted(delta.read_table(uri).to_pylist(), key=str) == sorted(
        [*first.to_pylist(), *second.to_pylist()], key=str
    )


def test_delta_rs_merges_into_a_mapped_table_by_its_names(tmp_path: Path) -> None:
    """The JVM-free merge of small batches uses delta-rs' MERGE with quoted names."""
    uri = str(tmp_path / "t")
    state = _state([1, 2, 3], "v")
    mapped = mapped_schema(state.schema)
    delta.create_table(uri, state.schema, [delta.write_file(uri, to_physical(state, mapped), "s")],
                       app="a", version=1, configuration={}, mapping=mapped)  # fmt: skip
    table = delta.open_table(uri)
    assert table is not None
    changes = pa.table({"id key": pa.array([2, 4], pa.int64()),
                        "a=b": pa.array(["changed", "new"]),
                        "gone": pa.array([False, False])})  # fmt: skip
    (
        table.merge(
            changes, predicate='t."id key" = s."id key"', source_alias="s", target_alias="t"
        )
        .when_matched_update({'"a=b"': 's."a=b"'})
        .when_not_matched_insert({'"id key"': 's."id key"', '"a=b"': 's."a=b"'})
        .execute()
    )
    got = sorted(delta.read_table(uri).to_pylist(), key=lambda r: r["id key"])
    assert got == [{"id key": 1, "a=b": "v1"}, {"id key": 2, "a=b": "changed"},
                   {"id key": 3, "a=b": "v3"}, {"id key": 4, "a=b": "new"}]  # fmt: skip
    reopened = delta.open_table(uri)
    assert reopened is not None and is_mapped(reopened)


def test_the_mapped_schema_keeps_column_metadata_and_refuses_a_case_pair() -> None:
    """Before: the schema was converted on placeholder names, which dropped every field's
    metadata (the lake's keys and types) and let "Name" and "name" through."""
    rows = pa.schema([pa.field("id", pa.int64(), metadata={"pglogrepl.key": "0"}),
                      pa.field("Name", pa.string())])  # fmt: skip
    mapped = mapped_schema(rows)
    assert mapped.schema["fields"][0]["metadata"]["pglogrepl.key"] == "0"
    with pytest.raises(Exception, match=r"(?i)duplicate|case"):
        mapped_schema(rows.append(pa.field("name", pa.string())))


def test_files_the_table_could_not_read_are_refused_by_the_commit(tmp_path: Path) -> None:
    """Before: all three were committed and their rows read as NULL."""
    first = _state([1], "v")
    mapped = mapped_schema(first.schema)
    plain = str(tmp_path / "plain")
    delta.commit_files(plain, first.schema, [delta.write_file(plain, first, "p")], app="a",
                       version=1, expected=None)  # fmt: skip
    with pytest.raises(ValueError, match="without column mapping"):
        physical = delta.write_file(plain, to_physical(first, mapped), "p")
        delta.commit_files(plain, first.schema, [physical], app="a", version=2, expected=1,
                           mapping=mapped)  # fmt: skip
    uri = str(tmp_path / "t")
    delta.commit_files(uri, first.schema, [delta.write_file(uri, to_physical(first, mapped), "w")],
                       app="a", version=1, expected=None, mapping=mapped)  # fmt: skip
    other = mapped_schema(first.schema)  # another mapping: other physical names
    for file in (delta.write_file(uri, to_physical(first, other), "o"),
                 delta.write_file(uri, first, "logical")):  # fmt: skip
        with pytest.raises(ValueError, match="not the physical names"):
            delta.commit_files(uri, first.schema, [file], app="a", version=2, expected=1)
    assert delta.read_table(uri).to_pylist() == first.to_pylist()


def test_struct_children_in_another_order_are_refused_not_swapped() -> None:
    """Before: ``_old{y, x}`` against a table's ``_old{x, y}`` stored each value in the other's
    column."""
    table_order = pa.table({"_old": pa.array([{"x": 1, "y": 2}])})
    batch = pa.table({"_old": pa.array([{"y": 200, "x": 100}])})
    with pytest.raises(ValueError, match="in order"):
        to_physical(batch, mapped_schema(table_order.schema))


def test_reader_version_2_is_spelled_out_as_the_column_mapping_feature() -> None:
    """Spark's form of a mapped table without other reader features (reader 2) is read as NULLs
    by deltalake's pyarrow readers; spelled out, they refuse it. Other forms stay as they are."""
    from airflow_pglogrepl.lake.mapping import spelled_out

    assert spelled_out({"minReaderVersion": 2, "minWriterVersion": 7,
                        "writerFeatures": ["columnMapping", "appendOnly"]}) == {
        "minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["columnMapping"],
        "writerFeatures": ["columnMapping", "appendOnly"],
    }  # fmt: skip
    # a legacy writer version's implied features stay (review finding: they were dropped)
    assert spelled_out({"minReaderVersion": 2, "minWriterVersion": 5})["writerFeatures"] == [
        "appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns",
        "columnMapping",
    ]  # fmt: skip
    named = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["columnMapping"],
             "writerFeatures": ["columnMapping"]}  # fmt: skip
    assert spelled_out(named) is named and spelled_out({"minReaderVersion": 1}) == {
        "minReaderVersion": 1
    }
