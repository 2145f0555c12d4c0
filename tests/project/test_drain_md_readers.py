"""The readers docs/drain.md shows under "Reading the lake" are run as written, against a lake
built by the lake's own writers: every snippet must read the state as the merges left it.

Without a JVM the state is written and merged by delta-rs: it has the ``deletionVectors``
reader feature (as every state table by default) but no vector. With Spark, a second lake's
state is merged by Spark, so it holds real deletion vectors, and every snippet, Spark's
included, must apply them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.tables import TableRef
from tests.support.keyed import KeyedBatches
from tests.support.paths import TESTS

DOC = TESTS.parent / "docs" / "drain.md"
ROOT = "/data/lake/orders"  # the lake the doc's snippets name
ORDERS = TableRef("public", "orders")


def snippets() -> list[str]:
    """The Python blocks of the section "Reading the lake" (its subsections included)."""
    text = DOC.read_text()
    start = text.index("### Reading the lake\n")
    section = text[start : text.index("\n### ", start + 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def snippet(word: str) -> str:
    (found,) = [code for code in snippets() if word in code]
    return found


def run(code: str, root: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "drain_md", **names}
    exec(compile(code.replace(ROOT, root), str(DOC), "exec"), namespace)
    return namespace


def rows(found: Any) -> dict[int, str]:
    """``id -> v`` of what a snippet read, whatever the library."""
    if hasattr(found, "to_pylist"):  # pyarrow
        found = found.to_pylist()
    elif hasattr(found, "to_dicts"):  # polars
        found = found.to_dicts()
    elif hasattr(found, "collect"):  # Spark
        found = [r.asDict() for r in found.collect()]
    elif hasattr(found, "to_dict"):  # pandas
        found = found.to_dict("records")
    return {int(r["id"]): r["v"] for r in found}


def build(root: Path, spark: Any = None) -> KeyedBatches:
    """The lake's ``public.orders``: inserts, then updates and deletes by key, merged by
    delta-rs, or by Spark when given (deletion vectors)."""
    lake = Lake(str(root), "orders")
    batches = KeyedBatches(lake, ORDERS)
    batches.inserts(range(1, 301))
    arrow_merge.merge_small(lake, ["public.orders"])
    batches.updates_and_deletes(range(1, 301), "new")
    if spark is None:
        arrow_merge.merge_small(lake, ["public.orders"])
    else:
        from airflow_pglogrepl.merge.materialize import materialize

        materialize(spark, lake, small_rows=0)
    assert batches.state() == batches.model
    return batches


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> KeyedBatches:
    return build(tmp_path_factory.mktemp("docs") / "orders")


def check(code: str, batches: KeyedBatches, **names: Any) -> dict[str, Any]:
    """Run one snippet on ``batches``' lake; what it read must be the state, row for row."""
    done = run(code, batches.lake.root, **names)
    read = done.get("orders", done.get("frame"))
    assert rows(read) == batches.model
    return done


def test_the_section_shows_every_reader() -> None:
    code = "\n".join(snippets())
    for shown in ('spark.read.format("delta")', "QueryBuilder().register(", "pl.read_delta(",
                  "duckdb.connect()", ".to_pandas()"):  # fmt: skip
        assert shown in code, shown


def test_deltalakes_query_builder_returns_pyarrow(lake: KeyedBatches) -> None:
    import pyarrow as pa

    done = check(snippet("QueryBuilder"), lake)
    assert isinstance(done["orders"], pa.Table)


def test_polars(lake: KeyedBatches) -> None:
    pytest.importorskip("polars")
    check(snippet("pl.read_delta"), lake)


def test_duckdb_on_the_arrow_table(lake: KeyedBatches) -> None:
    pytest.importorskip("duckdb")
    done = check(snippet("duckdb"), lake)
    assert done["count"] == [(len(lake.model),)]


def test_to_pandas_is_refused_and_the_one_line_alternative_reads_it(lake: KeyedBatches) -> None:
    """What the doc says of deltalake 1.6: refused for the reader feature, even without one
    vector in the table (this lake's merges were delta-rs')."""
    from deltalake import DeltaTable

    assert lake.vectors_written() == 0
    with pytest.raises(Exception, match=r"reader features: \{'deletionVectors'\}"):
        DeltaTable(lake.lake.paths.state(ORDERS)).to_pandas()
    check(snippet(".to_pandas()"), lake)


@pytest.mark.spark
def test_every_reader_applies_sparks_deletion_vectors(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    batches = build(tmp_path / "orders", spark)
    assert batches.vectors_written() > 0, "no deletion vector: the readers went untested on them"
    done = check(snippet("spark.read"), batches, spark=spark)
    deleted = {r.id for r in done["deletes"].collect()}
    assert deleted == set(range(5, 301, 5))
    check(snippet("QueryBuilder"), batches)
    check(snippet(".to_pandas()"), batches)
    for word, module in (("pl.read_delta", "polars"), ("duckdb", "duckdb")):
        pytest.importorskip(module)
        check(snippet(word), batches)
    with pytest.raises(Exception, match="deletionVectors"):
        DeltaTable(batches.lake.paths.state(ORDERS)).to_pandas()
