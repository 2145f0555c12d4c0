"""Minimal changelog batches and a catalog stub for the lake's window and lake tests: the lake
reads no more than ids, ops, commit LSNs and sequence numbers, and asks the catalog only what
these stubs answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from airflow_pglogrepl.lake.delta import read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.tables import TableRef

A, B = TableRef("public", "a"), TableRef("public", "b")


def batch(*rows: tuple[int, int, int]) -> pa.Table:
    """Changelog rows ``(id, commit_lsn, seq)`` (a minimal changelog: the lake reads no more)."""
    ids, lsns, seqs = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table({"id": pa.array(ids, pa.int64()), "_op": pa.array(["I"] * len(rows)),
                     "_commit_lsn": pa.array(lsns, pa.int64()),
                     "_seq": pa.array(seqs, pa.int64())})  # fmt: skip


def rows_of(lake: Lake, table: TableRef) -> list[tuple[int, int]]:
    data = read_table(lake.paths.changes(table)).to_pylist()
    return sorted((r["id"], r["_commit_lsn"]) for r in data)


def columns_of(lake: Lake, table: TableRef) -> dict[str, pa.Field]:
    from airflow_pglogrepl.lake.delta import arrow_schema

    schema = arrow_schema(lake.paths.changes(table))
    assert schema is not None
    return {f.name: f for f in schema}


def _num(name: str) -> int:
    """A distinct attribute number for each column name the stub is asked about."""
    return _NUMBERS.setdefault(name, 100 + len(_NUMBERS))


_NUMBERS: dict[str, int] = {}


def origins_stub(
    natts: int = 2, attnums: dict[str, int] | None = None, **missing: str | None
) -> Any:
    """A catalog stub: ``missing`` values by column (None: a default without one), attnums."""
    from airflow_pglogrepl.models.records import ColumnOrigin, ColumnOrigins

    def origins(table: TableRef, names: Sequence[str]) -> ColumnOrigins:
        columns = {
            n: ColumnOrigin(n, True, missing.get(n), n in missing, (attnums or {}).get(n, _num(n)))
            for n in names
        }
        return ColumnOrigins(natts=natts, columns=columns)

    return origins


DELTA_APP = "airflow-pglogrepl/s"


def id_rows(*ids: int) -> pa.Table:
    """Rows ``(id, _commit_lsn)`` with the same values: a Delta table's least content."""
    return pa.table({"id": pa.array(ids, pa.int64()), "_commit_lsn": pa.array(ids, pa.int64())})


def commit_ids(uri: str, version: int, expected: int | None, *ids: int) -> None:
    """One file of ``id_rows(*ids)`` committed as ``version`` (``expected``: the version the
    commit must follow, ``delta.commit_files``'s own check)."""
    from airflow_pglogrepl.lake import delta

    rows = id_rows(*ids)
    written = delta.write_file(uri, rows, prefix="t")
    delta.commit_files(uri, rows.schema, [written], app=DELTA_APP, version=version,
                       expected=expected)  # fmt: skip
