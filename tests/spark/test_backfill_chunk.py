"""A backfill chunk's size and its ranges, without a server: a chunk of a partitioned root
spans fewer block numbers the more leaves share them, and a chunk's ranges cover its blocks
once, the last chunk's open-ended. (The copy itself, live: test_backfill.py.)"""

from __future__ import annotations

from airflow_pglogrepl.postgres.snapshot import SnapshotTable
from airflow_pglogrepl.spark.backfill_chunk import blocks_per_chunk, split
from airflow_pglogrepl.tables import TableRef


def _table(blocks: int, span: int, reltuples: float, relpages: int) -> SnapshotTable:
    return SnapshotTable(
        table=TableRef("public", "t"), relid=1, relkind="p" if span < blocks else "r",
        replica_identity="d", columns=(), row_filter=None, blocks=blocks, reltuples=reltuples,
        relpages=relpages, publications=("p",), span=span,
    )  # fmt: skip


def test_a_chunk_spans_the_block_numbers_that_hold_its_rows() -> None:
    assert blocks_per_chunk(_table(1000, 1000, 100_000, 1000), 10_000) == 100
    # four leaves as big: a block number holds four blocks' rows
    assert blocks_per_chunk(_table(4000, 1000, 400_000, 4000), 10_000) == 25
    # never measured: 60 rows a block assumed; never less than one block
    assert blocks_per_chunk(_table(10, 10, -1, 0), 600) == 10
    assert blocks_per_chunk(_table(1000, 1000, 100_000, 1000), 1) == 1
    assert blocks_per_chunk(_table(0, 0, -1, 0), 600) == 10  # (empty: any step reads it)


def test_a_chunks_ranges_cover_its_blocks_once() -> None:
    assert split(10, 20, 3) == [(10, 14), (14, 18), (18, 20)]
    assert split(10, 11, 4) == [(10, 11)]
    assert split(30, None, 4) == [(30, None)]  # the last chunk reads whatever the table grew to
