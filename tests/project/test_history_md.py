"""The readers docs/history.md shows in its worked example are run as written, against a
history the lake's own writers made: order 7 inserted, paid, shipped, deleted; others around it."""

from __future__ import annotations

import datetime
import re
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.columns import IDENTITY_META, KEY_META
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.history import merge_history
from airflow_pglogrepl.tables import TableRef
from tests.support.paths import TESTS

DOC = TESTS.parent / "docs" / "history.md"
ROOT = "/data/lake/orders"
TABLE = [pa.field("id", pa.int64(), metadata={KEY_META: "0"}), pa.field("status", pa.string())]
SCHEMA = pa.schema([
    *TABLE, pa.field("_op", pa.string(), metadata={IDENTITY_META: "d"}),
    pa.field("_commit_lsn", pa.int64()), pa.field("_seq", pa.int64()),
    pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_unchanged", pa.list_(pa.string())), pa.field("_old", pa.struct(TABLE)),
])  # fmt: skip
# (op, id, status), one transaction each, a window each
CHANGES = [("I", 7, "new"), ("I", 8, "new"), ("U", 7, "paid"), ("U", 7, "shipped"),
           ("U", 8, "paid"), ("D", 7, None)]  # fmt: skip


def snippets() -> list[str]:
    text = DOC.read_text()
    start = text.index("## Reading it: a worked example\n")
    section = text[start : text.index("\n## ", start + 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def snippet(word: str) -> str:
    (found,) = [code for code in snippets() if word in code]
    return found


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[int]]:
    """The lake, and its window ends."""
    root = str(tmp_path_factory.mktemp("docs") / "orders")
    lake = Lake(root, "orders")
    ends, start = [], 0x1000100
    for op, key, status in CHANGES:
        lsn = start + 0x10
        stamp = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            hours=len(ends)
        )
        row = {"id": key, "status": status, "_op": op, "_commit_lsn": lsn, "_seq": 0,
               "_commit_ts": stamp, "_unchanged": [], "_old": None}  # fmt: skip
        window = Window(lake, LSN(start))
        window.write(TableRef("public", "orders"), pa.Table.from_pylist([row], schema=SCHEMA))
        start = lsn + 0x10
        window.commit(LSN(start), transactions=1, changes=1)
        merge_history(lake, ["public.orders"])
        ends.append(start)
    return root, ends


def run(code: str, root: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "history_md", **names}
    exec(compile(code.replace(ROOT, root), str(DOC), "exec"), namespace)
    return namespace


def test_the_rows_at_each_window_end_are_the_tables_then(lake: tuple[str, list[int]]) -> None:
    root, ends = lake
    model: dict[int, str] = {}
    for (op, key, status), end in zip(CHANGES, ends, strict=True):
        if op == "D":
            del model[key]
        else:
            model[key] = str(status)
        found = run(snippet("QueryBuilder"), root, P=end)["at_p"].to_pylist()
        assert {r["id"]: r["status"] for r in found} == model, hex(end)


def test_the_life_of_one_order(lake: tuple[str, list[int]]) -> None:
    pytest.importorskip("polars")
    life = run(snippet("pl.read_delta"), lake[0])["life"].to_dicts()
    assert [(r["status"], r["_ended_by"]) for r in life] == [
        ("new", "update"),
        ("paid", "update"),
        ("shipped", "delete"),
    ]


def test_the_time_spent_in_each_status(lake: tuple[str, list[int]]) -> None:
    pytest.importorskip("duckdb")
    spent = run(snippet("duckdb"), lake[0])["spent"]
    hours = [(key, status, span.total_seconds() / 3600) for key, status, span in spent]
    assert hours == [(7, "new", 2.0), (7, "paid", 1.0), (7, "shipped", 2.0), (8, "new", 3.0)]
