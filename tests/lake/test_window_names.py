"""Any PostgreSQL column name through the window API (no JVM, no server): each column is stored
under its lake name (``lake.names``), under Delta column mapping when a name needs it, and read
back under that name by delta-rs; a table without such names keeps a plain schema, and one
that gains such a name is turned to column mapping in place, its earlier rows kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake import changelog as cl
from airflow_pglogrepl.lake.delta import open_table, read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.mapping import PHYSICAL_KEY, is_mapped
from airflow_pglogrepl.lake.names import SOURCE_META, to_lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef

pytestmark = pytest.mark.unit

T = TableRef("public", "t")
LONG = "x" * 63
NAMES = ["id", "sp ace", "a=b", "x(y)", "tab\there", "Name", "name", "naïve名", LONG, "_op"]
LAKE_NAMES = [*NAMES[:6], "name__2", "naïve名", LONG, "_op__2"]


def changes(names: list[str], rows: list[dict[str, Any]], *, unchanged: list[str] | None = None,
            old: dict[str, Any] | None = None) -> pa.Table:  # fmt: skip
    """A changelog batch as the decoder makes one: the table's columns (``id`` the key), then
    the changelog's own, positionally (a table column may be called ``_op``)."""
    base = [pa.field(n, pa.int64() if n == "id" else pa.string()) for n in names]
    base = cl.mark_keys(base, ["id"])
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
    window = lake.open_window(LSN(0x100))
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
    assert fields[cl.COMMIT_LSN]["metadata"][PHYSICAL_KEY] == cl.COMMIT_LSN  # its stats' name
    # never read as NULLs without a word by the reader that cannot map
    with pytest.raises(Exception, match=r"(?i)columnMapping"):
        table.to_pyarrow_table()

    # the next window: the same columns find their recorded names, a new one is added
    later = {**row, "id": 2, "lsn": 0x210, "new col": "n"}
    window = lake.open_window(LSN(0x200))
    window.write(T, changes([*NAMES, "new col"], [later]))
    window.commit(LSN(0x300), transactions=1, changes=1)
    rows = sorted(read_table(uri).to_pylist(), key=lambda r: r["id"])
    assert [r["name__2"] for r in rows] == ["v6", "v6"] and [r["new col"] for r in rows] == [
        None,
        "n",
    ]
    assert lake.changes_version(T) == LSN(0x300)


def test_a_window_drained_again_adds_nothing_to_a_mapped_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run dies after the table's commit, before the commit point; the re-run drains
    the same changes again, and more, and the table holds each once."""
    root = str(tmp_path / "lake")
    first = Lake(root, "s")
    window = first.open_window(LSN(0x100))
    window.write(T, changes(["id", "sp ace"], [{"id": 1, "sp ace": "a", "lsn": 0x110}]))

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed")

    with monkeypatch.context() as patched:
        patched.setattr(Lake, "record", crash)
        with pytest.raises(RuntimeError, match="killed"):
            window.commit(LSN(0x200), transactions=1, changes=1)
    rerun = Lake(root, "s")
    assert rerun.position() is None
    again = rerun.open_window(LSN(0x100))
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


def test_a_plain_table_that_gains_a_name_delta_refuses_is_mapped_in_place(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"), "s")
    window = lake.open_window(LSN(0x100))
    window.write(T, changes(["id", "v"], [{"id": 1, "v": "a", "lsn": 0x110}]))
    window.commit(LSN(0x200), transactions=1, changes=1)
    uri = lake.paths.changes(T)
    table = open_table(uri)
    assert table is not None and not is_mapped(table)
    assert table.to_pyarrow_table().column("v").to_pylist() == ["a"]  # plain: every reader

    window = lake.open_window(LSN(0x200))
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
    window = lake.open_window(LSN(0x100))
    window.write(T, changes(["id", "v"], [{"id": 1, "v": "a", "lsn": 0x110}]))
    window.write(T, changes(["id", "v", "a=b"], [{"id": 2, "v": "b", "a=b": "x", "lsn": 0x120}]))
    window.commit(LSN(0x200), transactions=2, changes=2)
    rows = sorted(read_table(lake.paths.changes(T)).to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["v"], r["a=b"]) for r in rows] == [(1, "a", None), (2, "b", "x")]


def test_names_are_translated_by_position_and_recorded() -> None:
    batch = changes(["Name", "name"], [{"Name": "A", "name": "a", "lsn": 1}], unchanged=["name"])
    lake_batch, names = to_lake(batch, None)
    assert names == {"Name": "Name", "name": "name__2"}
    assert lake_batch.column_names[:2] == ["Name", "name__2"]
    assert lake_batch.column(cl.UNCHANGED).to_pylist() == [["name__2"]]
    again, _ = to_lake(batch, lake_batch.schema)  # what the lake now records
    assert again.schema.equals(lake_batch.schema, check_metadata=True)
    # a recorded name stays taken by its column: a source column later named like it differs
    clash = changes(["Name", "name", "name__2"], [{"lsn": 1}])
    assert to_lake(clash, lake_batch.schema)[1]["name__2"] == "name__2__2"
