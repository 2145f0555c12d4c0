"""Any PostgreSQL column name through the window API (no JVM, no server): each column is stored
under its lake name (``lake.column_names``), under Delta column mapping when a name needs it,
and read back under that name by delta-rs; a table without such names keeps a plain schema, and
one that gains such a name is turned to column mapping in place, its earlier rows kept."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog import columns as cl
from airflow_pglogrepl.lake.column_names import SOURCE_META, to_lake
from airflow_pglogrepl.lake.delta import open_table, read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.mapping import PHYSICAL_KEY, is_mapped
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef
from tests.support.crash import commit_dying_before_the_point

pytestmark = pytest.mark.unit

T = TableRef("public", "t")
LONG = "x" * 63
NAMES = ["id", "sp ace", "a=b", "x(y)", "tab\there", "Name", "name", "naïve名", LONG, "_op"]
LAKE_NAMES = [*NAMES[:6], "name__2", "naïve名", LONG, "_op__2"]


def changes(names: list[str], rows: list[dict[str, Any]], *, unchanged: list[str] | None = None,
            old: dict[str, Any] | None = None) -> pa.Table:  # fmt: skip
    """A changelog batch as the decoder makes one: the table's columns (the first, an integer,
    is the key), then the changelog's own, positionally (a table column may be called
    ``_op``)."""
    base = [pa.field(n, pa.int64() if i == 0 else pa.string()) for i, n in enumerate(names)]
    base = cl.mark_keys(base, [names[0]])
    schema = pa.schema([*base, *cl.meta_fields(base)])
    n = len(rows)
    columns: list[pa.Array] = [pa.array([r.get(c) for r in rows], f.type)
                               for c, f in zip(names, base, strict=True)]  # fmt: skip
    old_type = schema.field(len(names) + cl.META_COLUMNS.index(cl.OLD)).type
    columns += [
        pa.array(["U" if old else "I"] * n),
        pa.array([r["lsn"] for r in rows], pa.int64()),
        pa.array(range(1, n + 1), pa.int64()),
        pa.array([7] * n, pa.int64()),
        pa.array([None] * n, pa.timestamp("us", tz="UTC")),
        pa.array([unchanged or [] for _ in rows], pa.list_(pa.string())),
        pa.array([old] * n, old_type),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def test_every_name_is_kept_and_one_taken_without_case_gets_a_suffix(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    row = {n: f"v{i}" for i, n in enumerate(NAMES)} | {"id": 1, "lsn": 0x110}
    window = Window(lake, LSN(0x100))
    window.write(T, changes(NAMES, [row], unchanged=["name", "sp ace"],
                            old={"id": 0, "name": "was", "_op": "o"}))  # fmt: skip
    window.commit(LSN(0x200), transactions=1, changes=1)

    uri = lake.paths.changes(T)
    table = open_table(uri)
    assert table is not None and is_mapped(table)
    protocol = table.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "columnMapping" in (protocol.reader_features or [])
    got = read_table(uri).to_pylist()[0]
    assert [c for c in got if c not in cl.META_COLUMNS] == LAKE_NAMES
    assert {c: got[c] for c in LAKE_NAMES} == {
        lake_name: row[source] for source, lake_name in zip(NAMES, LAKE_NAMES, strict=True)
    }
    # what names the changelog's rows carry are lake names too
    assert got[cl.UNCHANGED] == ["name__2", "sp ace"]
    assert got[cl.OLD] == {**dict.fromkeys(LAKE_NAMES), "id": 0, "name__2": "was", "_op__2": "o"}
    fields = {f["name"]: f for f in json.loads(table.schema().to_json())["fields"]}
    assert fields["name__2"]["metadata"][SOURCE_META] == "name"
    assert fields["_op__2"]["metadata"][SOURCE_META] == "_op"
    assert SOURCE_META not in fields["Name"]["metadata"]
    assert lake.stored_as == {"public.t": {"name": "name__2", "_op": "_op__2"}}  # (the summary)
    assert fields[cl.COMMIT_LSN]["metadata"][PHYSICAL_KEY] == cl.COMMIT_LSN  # its stats' name
    # never read as NULLs without a word by the reader that cannot map
    with pytest.raises(Exception, match=r"(?i)columnMapping"):
        table.to_pyarrow_table()

    # the next window: the same columns find their recorded names, a new one is added
    later = {**row, "id": 2, "lsn": 0x210, "new col": "n"}
    window = Window(lake, LSN(0x200))
    window.write(T, changes([*NAMES, "new col"], [later]))
    window.commit(LSN(0x300), transactions=1, changes=1)
    rows = sorted(read_table(uri).to_pylist(), key=lambda r: r["id"])
    assert [r["name__2"] for r in rows] == ["v6", "v6"] and [r["new col"] for r in rows] == [
        None,
        "n",
    ]
    assert lake.changes_version(T) == LSN(0x300)


def test_a_window_drained_again_adds_nothing_to_a_mapped_table(
    lake_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run dies after the table's commit, before the commit point; the re-run drains
    the same changes again, and more, and the table holds each once."""
    root = lake_uri
    first = Lake(root, "s")
    window = Window(first, LSN(0x100))
    window.write(T, changes(["id", "sp ace"], [{"id": 1, "sp ace": "a", "lsn": 0x110}]))
    commit_dying_before_the_point(monkeypatch, window, LSN(0x200), changes=1)
    rerun = Lake(root, "s")
    assert rerun.position() is None
    again = Window(rerun, LSN(0x100))
    written = again.write(
        T,
        changes(
            ["id", "sp ace"],
            [{"id": 1, "sp ace": "a", "lsn": 0x110}, {"id": 2, "sp ace": "b", "lsn": 0x220}],
        ),
    )
    again.commit(LSN(0x300), transactions=2, changes=2)
    assert written == 1
    assert sorted(read_table(rerun.paths.changes(T)).column("sp ace").to_pylist()) == ["a", "b"]


def test_a_plain_table_that_gains_a_name_delta_refuses_is_mapped_in_place(lake_uri: str) -> None:
    lake = Lake(lake_uri, "s")
    window = Window(lake, LSN(0x100))
    window.write(T, changes(["id", "v"], [{"id": 1, "v": "a", "lsn": 0x110}]))
    window.commit(LSN(0x200), transactions=1, changes=1)
    uri = lake.paths.changes(T)
    table = open_table(uri)
    assert table is not None and not is_mapped(table)
    assert table.to_pyarrow_table().column("v").to_pylist() == ["a"]  # plain: every reader

    window = Window(lake, LSN(0x200))
    window.write(T, changes(["id", "v"], [{"id": 2, "v": "b", "lsn": 0x210}]))
    window.write(T, changes(["id", "v", "sp ace"], [{"id": 3, "v": "c", "sp ace": "s",
                                                      "lsn": 0x220}]))  # fmt: skip
    window.commit(LSN(0x300), transactions=2, changes=2)
    table = open_table(uri)
    assert table is not None and is_mapped(table)
    rows = sorted(read_table(uri).to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["v"], r["sp ace"]) for r in rows] == [
        (1, "a", None), (2, "b", None), (3, "c", "s"),
    ]  # fmt: skip
    fields = {f["name"]: f for f in json.loads(table.schema().to_json())["fields"]}
    assert fields["v"]["metadata"][PHYSICAL_KEY] == "v"  # the name its older files hold
    assert fields["sp ace"]["metadata"][PHYSICAL_KEY].startswith("col-")
    assert lake.changes_version(T) == LSN(0x300)


def test_a_new_table_that_gains_such_a_name_inside_its_first_window(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    window = Window(lake, LSN(0x100))
    window.write(T, changes(["id", "v"], [{"id": 1, "v": "a", "lsn": 0x110}]))
    window.write(T, changes(["id", "v", "a=b"], [{"id": 2, "v": "b", "a=b": "x", "lsn": 0x120}]))
    window.commit(LSN(0x200), transactions=2, changes=2)
    rows = sorted(read_table(lake.paths.changes(T)).to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["v"], r["a=b"]) for r in rows] == [(1, "a", None), (2, "b", "x")]


def test_names_are_translated_by_position_and_recorded() -> None:
    batch = changes(["id", "Name", "name"], [{"id": 1, "Name": "A", "name": "a", "lsn": 1}],
                    unchanged=["name"])  # fmt: skip
    lake_batch, names = to_lake(batch, None)
    assert names == {"id": "id", "Name": "Name", "name": "name__2"}
    assert lake_batch.column_names[:3] == ["id", "Name", "name__2"]
    assert lake_batch.column(cl.UNCHANGED).to_pylist() == [["name__2"]]
    again, _ = to_lake(batch, lake_batch.schema)  # what the lake now records
    assert again.schema.equals(lake_batch.schema, check_metadata=True)
    # a recorded name stays taken by its column: a source column later named like it differs
    clash = changes(["id", "Name", "name", "name__2"], [{"lsn": 1}])
    assert to_lake(clash, lake_batch.schema)[1]["name__2"] == "name__2__2"


def _catalog(attnums: dict[str, int]) -> Any:
    """A catalog stub: each column's attribute number, no defaults."""
    from airflow_pglogrepl.models.records import ColumnOrigin, ColumnOrigins

    def origins(table: TableRef, names: Any) -> ColumnOrigins:
        columns = {n: ColumnOrigin(n, True, None, False, attnums.get(n)) for n in names}
        return ColumnOrigins(natts=max(attnums.values()), columns=columns)

    return origins


def test_a_rename_inside_a_window_keeps_the_files_and_takes_the_key_along(
    tmp_path: Path,
) -> None:
    """The key and a column renamed between two batches of one window: one changelog column
    each, the earlier files read under the new names, ``_old``'s fields renamed too; a column
    added later under a former name is another column."""
    catalog = {"id": 1, "v": 2, "ident": 1, "val ue": 2}
    lake = Lake(str(tmp_path / "lake"), "s", origins=_catalog(catalog))
    window = Window(lake, LSN(0x100))
    window.write(T, changes(["id", "v"], [{"id": 1, "v": "a", "lsn": 0x110}]))
    window.commit(LSN(0x200), transactions=1, changes=1)
    uri = lake.paths.changes(T)
    assert not is_mapped(open_table(uri))  # type: ignore[arg-type]

    window = Window(lake, LSN(0x200))
    window.write(T, changes(["id", "v"], [{"id": 2, "v": "b", "lsn": 0x210}]))
    after = changes(["ident", "val ue"], [{"ident": 3, "val ue": "c", "lsn": 0x220}],
                    old={"ident": 2, "val ue": "b"})  # fmt: skip
    window.write(T, after)
    window.commit(LSN(0x300), transactions=2, changes=2)
    table = open_table(uri)
    assert table is not None and is_mapped(table)
    rows = sorted(read_table(uri).to_pylist(), key=lambda r: r["ident"])
    assert [(r["ident"], r["val ue"]) for r in rows] == [(1, "a"), (2, "b"), (3, "c")]
    assert rows[2][cl.OLD] == {"ident": 2, "val ue": "b"}
    fields = {f["name"]: f for f in json.loads(table.schema().to_json())["fields"]}
    assert fields["ident"]["metadata"]["pglogrepl.key"] == "0"
    assert fields["val ue"]["metadata"][PHYSICAL_KEY] == "v"  # the files' name, kept
    assert json.loads(fields["val ue"]["metadata"]["pglogrepl.former_names"]) == ["v"]

    lake.origins = _catalog({**catalog, "v": 3})
    window = Window(lake, LSN(0x300))
    window.write(T, changes(["ident", "val ue", "v"], [{"ident": 4, "v": "new", "lsn": 0x310}]))
    window.commit(LSN(0x400), transactions=1, changes=1)
    got = {r["ident"]: r["v__2"] for r in read_table(uri).to_pylist()}
    assert got == {1: None, 2: None, 3: None, 4: "new"}


def test_unchanged_entries_are_renamed_once_whatever_names_the_suffixes_take() -> None:
    """``name`` is stored as ``name__2`` and the real ``name__2`` as ``name__2__2``: an
    unchanged ``name`` is ``name__2``, never renamed on to ``name__2__2`` (the wrong column
    would keep its value and the right one read NULL)."""
    batch = changes(["id", "Name", "name", "name__2", "_op", "_op__2"], [{"id": 1, "lsn": 1}],
                    unchanged=["name", "name__2", "_op"])  # fmt: skip
    lake_batch, names = to_lake(batch, None)
    assert names["name__2"] == "name__2__2" and names["_op__2"] == "_op__2__2"
    assert lake_batch.column(cl.UNCHANGED).to_pylist() == [["name__2", "name__2__2", "_op__2"]]


def test_a_sliced_batch_with_null_unchanged_lists_is_renamed() -> None:
    """The drain hands a window the rest of a peek's batch (a slice), whose ``_unchanged``
    lists may be null: renaming them must not depend on the slice's offset."""
    rows = [{"id": i, "name": str(i), "lsn": i} for i in range(4)]
    batch = changes(["id", "Name", "name"], rows, unchanged=["name"])
    index = batch.column_names.index(cl.UNCHANGED)
    nulls = pa.array([["name"], None, ["name"], None], pa.list_(pa.string()))
    batch = batch.set_column(index, batch.field(index), nulls).slice(1)
    lake_batch, _ = to_lake(batch, None)
    assert lake_batch.column(cl.UNCHANGED).to_pylist() == [None, ["name__2"], None]


@pytest.mark.parametrize("name", ["_op", "_old", "_unchanged", "_commit_lsn"])
def test_the_decoders_take_a_source_column_named_like_the_changelogs_own(name: str) -> None:
    from airflow_pglogrepl.changelog.rows import ChangelogBatch
    from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
    from airflow_pglogrepl.pgoutput.values import OID

    info = TableInfo("public", "t", [ColumnInfo("id", OID.INT8, -1, True, OID.INT8),
                                     ColumnInfo(name, OID.TEXT, -1, False, OID.TEXT)])  # fmt: skip
    empty = ChangelogBatch(info).to_arrow()
    assert empty.column_names == ["id", name, *cl.META_COLUMNS]
    assert to_lake(empty, None)[1][name] == f"{name}__2"


def test_the_first_commit_of_a_mapped_table_carries_the_commit_lsn_statistics(
    tmp_path: Path,
) -> None:
    """What the merge's range filter skips files by, as on every later commit."""
    lake = Lake(str(tmp_path / "lake"), "s")
    window = Window(lake, LSN(0x100))
    window.write(T, changes(["id", "sp ace"], [{"id": 1, "lsn": 0x110}, {"id": 2, "lsn": 0x120}]))
    window.commit(LSN(0x200), transactions=1, changes=1)
    table = open_table(lake.paths.changes(T))
    assert table is not None
    (stats,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert (stats[f"min.{cl.COMMIT_LSN}"], stats[f"max.{cl.COMMIT_LSN}"]) == (0x110, 0x120)


def test_names_that_moved_between_columns_are_refused_and_a_column_added_again_is_not(
    tmp_path: Path,
) -> None:
    """``b`` and ``c`` swapped by renames look like the same names in another order; a column
    dropped and added again under its name looks the same way, and is the lake's same
    column. The catalog's attribute numbers tell them apart."""
    from airflow_pglogrepl.exceptions import IncompatibleSchemaChangeError

    lake = Lake(str(tmp_path / "lake"), "s", origins=_catalog({"id": 1, "b": 2, "c": 3}))
    window = Window(lake, LSN(0x100))
    window.write(T, changes(["id", "b", "c"], [{"id": 1, "b": "b1", "c": "c1", "lsn": 0x110}]))
    window.commit(LSN(0x200), transactions=1, changes=1)
    swapped = changes(["id", "c", "b"], [{"id": 2, "c": "was b", "b": "was c", "lsn": 0x210}])
    lake.origins = _catalog({"id": 1, "c": 2, "b": 3})
    with pytest.raises(IncompatibleSchemaChangeError, match=r"\['b', 'c'\] took each other"):
        Window(lake, LSN(0x200)).write(T, swapped)
    lake.origins = _catalog({"id": 1, "c": 3, "b": 4})  # b dropped, then added again
    window = Window(lake, LSN(0x200))
    window.write(T, swapped)
    window.commit(LSN(0x300), transactions=1, changes=1)
    got = {r["id"]: (r["b"], r["c"]) for r in read_table(lake.paths.changes(T)).to_pylist()}
    assert got == {1: ("b1", "c1"), 2: ("was c", "was b")}


def test_a_rename_commits_with_the_rows_written_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window holding rows from before and after ``RENAME a TO b``: the rename and the rows
    are one commit. Had the rename been a version of its own, a run that died before the rows'
    commit would leave its re-run to meet the old rows' ``a`` as a former name, stored as a new
    column ``a__2`` (the state's ``b`` NULL for them)."""
    from airflow_pglogrepl.lake import delta as delta_module

    lake = Lake(str(tmp_path / "lake"), "s", origins=_catalog({"id": 1, "a": 2}))
    window = Window(lake, LSN(0x100))
    window.write(T, changes(["id", "a"], [{"id": 1, "a": "x1", "lsn": 0x110}]))
    window.commit(LSN(0x200), transactions=1, changes=1)

    def renaming_window(lake: Lake) -> Any:
        window = Window(lake, LSN(0x200))
        window.write(T, changes(["id", "a"], [{"id": 2, "a": "x2", "lsn": 0x210}]))  # before
        window.write(T, changes(["id", "b"], [{"id": 3, "b": "x3", "lsn": 0x220}]))  # after
        return window

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed before the rows' commit")

    renamed = _catalog({"id": 1, "b": 2})
    window = renaming_window(Lake(lake.root, "s", origins=renamed))
    with monkeypatch.context() as patched:
        patched.setattr(delta_module, "commit_files", crash)
        with contextlib.suppress(RuntimeError):
            window.commit(LSN(0x300), transactions=2, changes=2)
    rerun = Lake(lake.root, "s", origins=renamed)
    if rerun.position() != LSN(0x300):  # the run died: the next one drains the window again
        renaming_window(rerun).commit(LSN(0x300), transactions=2, changes=2)
    rows = read_table(lake.paths.changes(T))
    assert [n for n in rows.column_names if n not in cl.META_COLUMNS] == ["id", "b"]
    assert sorted(zip(rows.column("id").to_pylist(), rows.column("b").to_pylist(),
                      strict=True)) == [(1, "x1"), (2, "x2"), (3, "x3")]  # fmt: skip


def test_a_cycle_of_renames_after_a_column_was_added_again_is_refused(tmp_path: Path) -> None:
    """``b`` dropped and added again takes a new attribute number, which the lake records; a
    later cycle of renames that puts the names back in the lake's column order is still seen
    (by the recorded numbers) and refused, not stored under the wrong names."""
    from airflow_pglogrepl.exceptions import IncompatibleSchemaChangeError

    lake = Lake(str(tmp_path / "lake"), "s", origins=_catalog({"id": 1, "b": 2, "c": 3}))
    window = Window(lake, LSN(0x100))
    window.write(T, changes(["id", "b", "c"], [{"id": 1, "b": "B1", "c": "C1", "lsn": 0x110}]))
    window.commit(LSN(0x200), transactions=1, changes=1)
    lake = Lake(lake.root, "s", origins=_catalog({"id": 1, "c": 3, "b": 4}))  # b added again
    window = Window(lake, LSN(0x200))
    window.write(T, changes(["id", "c", "b"], [{"id": 2, "c": "C2", "b": "B2", "lsn": 0x210}]))
    window.commit(LSN(0x300), transactions=1, changes=1)
    cycled = Lake(lake.root, "s", origins=_catalog({"id": 1, "b": 3, "c": 4}))  # b <-> c
    with pytest.raises(IncompatibleSchemaChangeError, match=r"took each other's names"):
        Window(cycled, LSN(0x300)).write(
            T, changes(["id", "b", "c"], [{"id": 3, "b": "C3", "c": "B3", "lsn": 0x310}])
        )
    got = {r["id"]: (r["b"], r["c"]) for r in read_table(lake.paths.changes(T)).to_pylist()}
    assert got == {1: ("B1", "C1"), 2: ("B2", "C2")}
