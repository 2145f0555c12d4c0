"""A keyed batch's net change in Arrow: one row per touched key with its latest sent values,
what was sent and whether the key's last change deletes it; declined (None) for a TRUNCATE or a
key change; and the lookup of the rows whose unsent values must be kept from the state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_pglogrepl.merge import net_upserts as m

TABLE = [pa.field("id", pa.int64()), pa.field("v", pa.int64()), pa.field("big", pa.string())]
SCHEMA = pa.schema(
    [
        *TABLE,
        pa.field("_op", pa.string()),
        pa.field("_commit_lsn", pa.int64()),
        pa.field("_seq", pa.int64()),
        pa.field("_unchanged", pa.list_(pa.string())),
        pa.field("_old", pa.struct(TABLE)),
    ]
)


def batch(*changes: tuple[Any, ...]) -> pa.Table:
    """``(op, id, v, big, unchanged, old)`` in commit order, given out of order on purpose (the
    reduction orders by ``_commit_lsn``)."""
    rows = [{"id": id_, "v": v, "big": big, "_op": op, "_commit_lsn": 0x10 * (n + 1), "_seq": 0,
             "_unchanged": list(unchanged), "_old": old}
            for n, (op, id_, v, big, unchanged, old) in enumerate(changes)]  # fmt: skip
    return pa.Table.from_pylist(rows[::-1], schema=SCHEMA)


def by_key(net: pa.Table) -> dict[int, dict[str, Any]]:
    return {row["id"]: row for row in net.to_pylist()}


def test_each_key_keeps_its_latest_sent_value_and_whether_it_was_sent() -> None:
    net = m.net_upserts(
        batch(
            ("I", 1, 10, "a", (), None),
            ("U", 1, 11, None, ("big",), None),  # big unchanged: the insert's "a" is the latest
            ("U", 2, 20, None, ("big",), None),  # never inserted here: big kept from the state
            ("I", 3, 30, "c", (), None),
            ("D", 3, None, None, (), None),
        ),
        ["id"],
        ["v", "big"],
    )
    assert net is not None
    rows = by_key(net)
    assert (rows[1]["v"], rows[1]["big"], rows[1][m.sent_column(1)]) == (11, "a", True)
    assert (rows[1][m._FILL], rows[1][m.DELETE_COLUMN]) == (False, False)
    assert (rows[2]["v"], rows[2][m.sent_column(0)], rows[2][m.sent_column(1)]) == (20, True, False)
    assert rows[2]["big"] is None and rows[2][m._FILL] is True
    assert rows[3][m.DELETE_COLUMN] is True


def test_a_truncate_or_a_key_change_is_not_reduced_here() -> None:
    truncated = batch(("I", 1, 1, "a", (), None), ("T", None, None, None, (), None))
    assert m.net_upserts(truncated, ["id"], ["v", "big"]) is None
    moved = batch(("U", 2, 1, "a", (), {"id": 1, "v": 1, "big": "a"}))
    assert m.net_upserts(moved, ["id"], ["v", "big"]) is None
    same_key = batch(("U", 1, 2, "a", (), {"id": 1, "v": 1, "big": "a"}))
    assert m.net_upserts(same_key, ["id"], ["v", "big"]) is not None


def test_a_kept_value_of_a_key_with_no_state_row_is_reported() -> None:
    net = m.net_upserts(batch(("U", 7, 1, None, ("big",), None)), ["id"], ["v", "big"])
    assert net is not None
    assert m.updates_of_missing_rows(None, net, ["id"], ["v", "big"]) == [7]
    inserted = m.net_upserts(batch(("I", 7, 1, "a", (), None), ("U", 7, 2, None, ("big",), None)),
                             ["id"], ["v", "big"])  # fmt: skip
    assert inserted is not None
    assert m.updates_of_missing_rows(None, inserted, ["id"], ["v", "big"]) == []


def test_the_rows_of_unchanged_values_are_looked_up_for_any_number_of_keys(tmp_path: Path) -> None:
    """An UPDATE of 25,000 rows that leaves a TOASTed column unchanged: the lookup of their
    rows in the state was one IN list, which DataFusion parsed recursively until the process
    died by SIGSEGV, with nothing reported (each retry died the same way). Run in a process of
    its own: the failure was that process dying."""
    code = f"""
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from airflow_pglogrepl.merge import net_upserts as m
n = 25_000
write_deltalake({str(tmp_path / "state")!r}, pa.table({{"id": pa.array(range(n), pa.int64())}}))
net = pa.table({{"id": pa.array(range(n + 1), pa.int64()), m.sent_column(0): [False] * (n + 1),
                m.DELETE_COLUMN: [False] * (n + 1), m._FILL: [True] * (n + 1)}})
print(m.updates_of_missing_rows(DeltaTable({str(tmp_path / "state")!r}), net, ["id"], ["v"]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "[25000]"
