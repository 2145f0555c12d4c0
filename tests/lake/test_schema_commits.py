"""The commits that change a table's schema: a rename under column mapping is a metadata commit
that keeps every value, a rename Delta could not open is refused before anything is written, and
a table replaced by an empty one never goes back below what it holds, with or without mapping."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import LakeCommitConflictError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.mapping import is_mapped, to_physical
from airflow_pglogrepl.lake.schema_commits import reset_table
from tests.support.mapped_tables import create_mapped


def test_a_rename_is_a_metadata_commit_that_keeps_every_value(tmp_path: Path) -> None:
    """A rename on the publisher becomes a rename in the lake: the old values read under the
    new name (in ``_old`` too), and files written after it land under the same column."""
    from airflow_pglogrepl.lake.mapping import mapped_of
    from airflow_pglogrepl.lake.schema_commits import rename_columns

    uri, rows = create_mapped(tmp_path)
    version = rename_columns(uri, {"sp ace": "space now", "a=b": "Name__3"})
    assert version == 1
    renamed = rows.rename_columns(
        [
            "space now" if n == "sp ace" else "Name__3" if n == "a=b" else n
            for n in rows.column_names
        ]
    )
    back = delta.read_table(uri)
    assert back.column("space now").to_pylist() == rows.column("sp ace").to_pylist()
    assert [f.name for f in back.schema.field("_old").type] == ["space now", "Name__3"]
    table = delta.open_table(uri)
    assert table is not None
    mapped = mapped_of(table)
    assert mapped is not None
    old = pa.struct([pa.field(n, pa.int64()) for n in ("space now", "Name__3")])
    later = pa.table(
        {
            **{n: renamed.column(n).slice(0, 1) for n in renamed.column_names if n != "_old"},
            "_old": pa.array([None], old),
        }
    ).select(renamed.column_names)
    file = delta.write_file(uri, to_physical(later, mapped), "later")
    delta.commit_files(uri, later.schema, [file], app="a", version=2, expected=1)
    got = delta.read_table(uri).column("space now").to_pylist()
    assert sorted(got, key=str) == sorted([1, 2, None, 1], key=str)
    with pytest.raises(ValueError, match="which Delta takes for one"):
        rename_columns(uri, {"x(y)": "space now"})


@pytest.mark.spark
def test_spark_reads_a_renamed_column_with_its_old_values(tmp_path: Path, spark: object) -> None:
    from airflow_pglogrepl.lake.schema_commits import rename_columns

    uri, rows = create_mapped(tmp_path)
    rename_columns(uri, {"sp ace": "space now"})
    frame = spark.read.format("delta").load(uri)  # type: ignore[attr-defined]
    got = sorted((r[0] for r in frame.select("`space now`").collect()), key=str)
    assert got == sorted(rows.column("sp ace").to_pylist(), key=str)
    assert "sp ace" not in frame.columns


def test_a_rename_delta_could_not_open_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Before: a rename to a name equal to another without case was committed, and the table
    could not be opened again (delta-rs: duplicate field name)."""
    from airflow_pglogrepl.lake.schema_commits import rename_columns

    uri, _ = create_mapped(tmp_path)
    for renames in ({"a=b": "NAME"}, {"sp ace": "_commit_lsn"}, {"_old": "old"}):
        with pytest.raises(ValueError):
            rename_columns(uri, renames)
    table = delta.open_table(uri)
    assert table is not None and table.version() == 0


@pytest.mark.parametrize("mapped", [False, True], ids=["plain", "mapped"])
def test_a_reset_empties_the_table_once_and_never_below_what_it_holds(
    tmp_path: Path, mapped: bool
) -> None:
    """One ``reset_table`` for both kinds of table: delta-rs replaces a plain one, the lake's own
    commit a mapped one (fresh physical names); either way the app's version only goes up."""
    if mapped:
        uri, _ = create_mapped(tmp_path)
    else:
        uri = str(tmp_path / "t")
        rows = pa.table({"id": pa.array([1, 2], pa.int64())})
        delta.commit_files(uri, rows.schema, [delta.write_file(uri, rows, "p")], app="a",
                           version=1, expected=None)  # fmt: skip
    schema = pa.schema([("id", pa.int64()), ("note", pa.string())])
    with pytest.raises(LakeCommitConflictError):
        reset_table(uri, schema, app="a", version=1)
    reset_table(uri, schema, app="a", version=5)
    table = delta.open_table(uri)
    assert table is not None and is_mapped(table) == mapped
    assert delta.txn_version(uri, "a") == 5
    assert delta.read_table(uri).num_rows == 0
    assert [f.name for f in delta.arrow_schema(uri) or []] == ["id", "note"]
