"""Helpers for drain tests: a workload on live tables, and comparing the lake with the source."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster

TYPED_TABLE = """
CREATE TABLE {name} (
    id bigint PRIMARY KEY,
    i int, f float8, n numeric(12, 2), b bool, d date, ts timestamp, tz timestamptz,
    u uuid, j jsonb, raw bytea, arr int[], t text, big text
)"""
COLUMNS = ("id", "i", "f", "n", "b", "d", "ts", "tz", "u", "j", "raw", "arr", "t", "big")


def random_row(rng: random.Random, key: int, big: bool = False) -> tuple[Any, ...]:
    """Values for TYPED_TABLE; about one value in six is NULL."""

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.16 else value

    base = dt.datetime(2024, 1, 1) + dt.timedelta(seconds=rng.randrange(10**8))
    return (
        key,
        maybe(rng.randrange(-(2**31), 2**31)),
        maybe(rng.choice([0.5, -1.25, 1e300, rng.random()])),
        maybe(decimal.Decimal(rng.randrange(-(10**11), 10**11)) / 100),
        maybe(rng.random() < 0.5),
        maybe(base.date()),
        maybe(base),
        maybe(base.replace(tzinfo=dt.UTC)),
        maybe(uuid.UUID(int=rng.getrandbits(128))),
        maybe(json.dumps({"k": rng.randrange(100), "s": "é\"'"})),
        maybe(rng.randbytes(rng.randrange(0, 20))),
        maybe([rng.randrange(100) for _ in range(rng.randrange(4))]),
        maybe(rng.choice(["plain", "O'Reilly", "tab\there", "ünï", ""])),
        # > 8 kB of incompressible text: stored out of line (TOAST)
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=9000)) if big else None,
    )


def insert_sql(table: str) -> str:
    return f"INSERT INTO {table} ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})"


def normalize(value: Any) -> Any:
    """One comparable form for a value read from PostgreSQL (psycopg) or the lake (pyarrow)."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value.startswith("{") and '"k"' in value:
        return json.dumps(json.loads(value), sort_keys=True)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    if isinstance(value, float):
        return round(value, 9) if abs(value) < 1e15 else value
    return value


def source_rows(cluster: PgCluster, db: str, table: str) -> list[tuple[Any, ...]]:
    rows = cluster.execute(f"SELECT * FROM {table} ORDER BY 1", dbname=db)
    return [tuple(normalize(v) for v in row) for row in rows]


def read_delta(path: Path) -> Any:
    """The table's current version through ``deltalake`` (no JVM), as a reader would see it."""
    from airflow_pglogrepl.lake.delta import read_table

    return read_table(str(path))


def lake_rows(sink: str, ref: TableRef, kind: str = "state") -> list[tuple[Any, ...]]:
    path = Path(sink) / kind / table_dir(ref)
    if not path.exists():
        return []
    table = read_delta(path)
    names = [n for n in table.column_names if not n.startswith("_")]
    rows = [tuple(normalize(r[n]) for n in names) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: r[0])


def changelog(sink: str, ref: TableRef) -> list[dict[str, Any]]:
    path = Path(sink) / "changes" / table_dir(ref)
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = read_delta(path).to_pylist()
    return rows


def all_changelog_keys(sink: str, tables: Iterable[TableRef]) -> list[tuple[int, int]]:
    keys: list[tuple[int, int]] = []
    for ref in tables:
        keys += [(r["_commit_lsn"], r["_seq"]) for r in changelog(sink, ref)]
    return keys
