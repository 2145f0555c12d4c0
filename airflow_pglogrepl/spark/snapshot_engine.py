"""Which way a table's snapshot copy is made: in the application's own process, or on Spark.

Spark's start (a JVM, then Python workers: 20 to 60 s on a small machine) costs more than
copying a small table takes, and its parallel tasks pay off only for big ones, on executors
beyond this machine. ``SPARK_ABOVE_BYTES`` is a first setting, where that start is a small part
of the copy; ``bench/bench_snapshot.py`` measures both ways side by side. A run whose tables
are all small never starts Spark, and one that has a big table starts it before the slot is
created, as before (the exporting session then waits for no JVM).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_pglogrepl.postgres.snapshot import SnapshotTable
    from airflow_pglogrepl.tables import TableRef

__all__ = [
    "BLOCK_BYTES",
    "ENGINES",
    "SPARK_ABOVE_BYTES",
    "check_engine",
    "on_spark",
    "spark_needed",
]

ENGINES = ("auto", "process", "spark")
BLOCK_BYTES = 8192  # a heap block at PostgreSQL's default block size: sizes are compared in it
SPARK_ABOVE_BYTES = 1 << 30  # a heap bigger than this is copied on Spark (``engine="auto"``)


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"snapshot engine {engine!r} is none of {', '.join(ENGINES)}")
    return engine


def on_spark(table: SnapshotTable, *, engine: str, resnapshot: bool, above: int) -> bool:
    """Whether ``table`` is copied on Spark: as ``engine`` says, else (``auto``) when its heap
    is bigger than ``above`` bytes. A re-snapshot is always (it overwrites a table that exists,
    which Spark's writer does)."""
    if engine == "spark" or resnapshot:
        return True
    return engine == "auto" and table.blocks * BLOCK_BYTES > above


def spark_needed(source: Any, publications: Sequence[str], tables: Sequence[TableRef] | None,
                 *, engine: str, above: int) -> bool:  # fmt: skip
    """Whether a snapshot of ``publications`` (``tables`` only, when given) will copy a table on
    Spark, judged from the tables' sizes now (outside any snapshot: a table that grows past
    ``above`` meanwhile starts Spark when its copy begins)."""
    if engine != "auto" or tables is not None:
        return engine == "spark" or tables is not None
    from airflow_pglogrepl.postgres.snapshot import SnapshotReader

    with source.session() as conn:
        found = SnapshotReader(source.connection_params()).published_tables(conn, publications)
    return any(on_spark(t, engine=engine, resnapshot=False, above=above) for t in found)
