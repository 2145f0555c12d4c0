"""Random changes (``history_model.random_changes``) committed to a lake as its windows, and a
lake's history read back in the model's terms: the histories the merge paths make, compared
with the model's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from airflow_pglogrepl.changelog.columns import IDENTITY_META, KEY_META
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.tables import TableRef
from tests.support.history_model import CHANGES, TYPES

T = TableRef("public", "t")
NAME = "public.t"


def kind(keyed: bool, full: bool) -> str:
    """The table's replica identity as the changelog marks it."""
    return "f" if full else ("d" if keyed else "n")


def changes_schema(keyed: bool, full: bool) -> pa.Schema:
    """The model's changelog schema, marked with the key and the replica identity."""
    fields = []
    for field in CHANGES:
        if field.name == "id" and keyed and not full:
            field = field.with_metadata({KEY_META: "0"})
        elif field.name == "_op":
            field = field.with_metadata({IDENTITY_META: kind(keyed, full)})
        fields.append(field)
    return pa.schema(fields)


def changes_of(table: list[pa.Field], identity: str = "d") -> pa.Schema:
    """A changelog schema of ``table``'s own fields (its key marked on them) and the meta
    columns, the replica identity marked."""
    return pa.schema([
        *table,
        pa.field("_op", pa.string(), metadata={IDENTITY_META: identity}),
        pa.field("_commit_lsn", pa.int64()),
        pa.field("_seq", pa.int64()),
        pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
        pa.field("_unchanged", pa.list_(pa.string())),
        pa.field("_old", pa.struct(table)),
    ])  # fmt: skip


def commit_windows(lake: Lake, changes: Sequence[dict[str, Any]], cuts: Sequence[int], *,
                   keyed: bool, full: bool, start: int = 0x100) -> list[LSN]:  # fmt: skip
    """``changes`` (ascending commit LSNs above ``start``) as windows ending at each of
    ``cuts`` and after the last change; the window ends, ascending."""
    schema = changes_schema(keyed, full)
    last = max(c["_commit_lsn"] for c in changes) + 1 if changes else start + 1
    ends, low = [], start
    for cut in [*sorted(c for c in cuts if start < c < last), last]:
        rows = [c for c in changes if low <= c["_commit_lsn"] < cut]
        window = Window(lake, LSN(low))
        if rows:
            window.write(T, pa.Table.from_pylist(rows, schema=schema))
        window.commit(LSN(cut), transactions=len({r["_commit_lsn"] for r in rows}),
                      changes=len(rows))  # fmt: skip
        ends.append(LSN(cut))
        low = cut
    return ends


def history_rows(lake: Lake) -> list[dict[str, Any]]:
    """Every version ``history/<t>`` holds, as the model's rows."""
    rows = delta.scan(lake.paths.history(T)).select(TYPES.names).cast(TYPES)
    return list(rows.to_pylist())


def commits(lake: Lake) -> list[dict[str, Any]]:
    """The history's commits, oldest first (each with its ``operation`` and metrics)."""
    from airflow_pglogrepl.lake.commit_infos import newest_first

    uri = lake.paths.history(T)
    table = delta.open_table(uri)
    assert table is not None
    return list(reversed(list(newest_first(uri, int(table.version())))))
