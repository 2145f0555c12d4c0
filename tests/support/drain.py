"""Helpers for drain tests: a workload on live tables, drains in this process or as an
application of their own, and comparing the lake with the source.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import table_dir
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.pipeline.results import DrainResult
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.sources import Source

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


def read_delta(path: Path | str) -> Any:
    """The table's current version through ``deltalake`` (no JVM), as a reader would see it."""
    from airflow_pglogrepl.lake.delta import read_table

    return read_table(str(path))


def _table(lake_root: str, kind: str, ref: TableRef) -> str | None:
    """The URI of a lake's table (on a path or in a bucket), None when it has none."""
    from airflow_pglogrepl.lake.delta import open_table

    uri = f"{lake_root}/{kind}/{table_dir(ref)}"
    return None if open_table(uri) is None else uri


def app_env() -> dict[str, str]:
    """An application's environment as an operator makes it: the lake's store, when the
    process has one (``lake_uri`` on the S3 server)."""
    from airflow_pglogrepl.lake import storage

    store = storage.current()
    return {} if store is None else {storage.STORE_ENV: store.to_json()}


def lake_rows(lake_root: str, ref: TableRef, kind: str = "state") -> list[tuple[Any, ...]]:
    path = _table(lake_root, kind, ref)
    if path is None:
        return []
    table = read_delta(path)
    names = [n for n in table.column_names if not n.startswith("_")]
    rows = [tuple(normalize(r[n]) for n in names) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: r[0])


def changelog(lake_root: str, ref: TableRef) -> list[dict[str, Any]]:
    path = _table(lake_root, "changes", ref)
    if path is None:
        return []
    rows: list[dict[str, Any]] = read_delta(path).to_pylist()
    return rows


def all_changelog_keys(lake_root: str, tables: Iterable[TableRef]) -> list[tuple[int, int]]:
    keys: list[tuple[int, int]] = []
    for ref in tables:
        keys += [(r["_commit_lsn"], r["_seq"]) for r in changelog(lake_root, ref)]
    return keys


def drain_in_process(
    spark: Any,
    src: Source,
    lake_root: str,
    *,
    window: int,
    batch_rows: int = 200_000,
    columnar: bool = True,
    small_rows: int | None = None,
    reader: str = "auto",
    resnapshot: bool = False,
    backfill_rows: int | None = None,
    resync: Sequence[str] = (),
    parity: Sequence[str] = (),
    parity_repair: bool = False,
) -> dict[str, Any]:
    """One drain run on the session's Spark (no JVM start), then materialize, under the lock;
    ``small_rows`` as ``materialize`` takes it (0: every merge by Spark); ``resnapshot``: the
    tables the run finds incomplete are copied again first; ``backfill_rows``: they are
    backfilled online in chunks of about that many rows (the application's default), as the
    tables of ``resync`` are."""
    from airflow_pglogrepl.pipeline.repair import Repair
    from airflow_pglogrepl.spark.backfill import OnlineBackfill
    from airflow_pglogrepl.spark.resnapshot import Resnapshot

    hook = src.hook()
    lake = Lake(lake_root, src.slot, origins=hook.column_origins)
    with hook.writer_lock(src.slot) as lock:
        lake.writer_check = lock.check
        whole = Resnapshot(spark=lambda: spark, source=hook, lake=lake, slot=src.slot,
                           publications=[src.publication])  # fmt: skip
        repair: Repair | None = whole if resnapshot else None
        if backfill_rows is not None or resync or parity:
            repair = OnlineBackfill(spark=lambda: spark, source=hook, lake=lake, slot=src.slot,
                                    publications=[src.publication], fallback=whole,
                                    on_gaps="backfill" if backfill_rows else "report",
                                    resync=resync, parity=parity, parity_repair=parity_repair,
                                    chunk_rows=backfill_rows or 40)  # fmt: skip
        result = Drain(
            source=hook, lake=lake, slot=src.slot, publications=[src.publication],
            max_window_bytes=window, batch_rows=batch_rows, columnar=columnar, reader=reader,
            repair=repair,
        ).run(time.monotonic()).to_dict()  # fmt: skip
        result["materialized"] = (
            materialize(spark, lake)
            if small_rows is None
            else materialize(spark, lake, small_rows=small_rows)
        )
    return result


def drain_only(
    src: Source,
    lake_root: str,
    *,
    window: int,
    columnar: bool = True,
    max_windows: int | None = None,
    reader: str = "auto",
    accept_incomplete: Sequence[str] = (),
    accept_source_change: bool = False,
) -> DrainResult:
    """One drain run without the merge, under the lock: no Spark (a local lake needs none to
    drain), and the windows as the run committed them."""
    hook = src.hook()
    lake = Lake(lake_root, src.slot, origins=hook.column_origins)
    with hook.writer_lock(src.slot):
        return Drain(
            source=hook, lake=lake, slot=src.slot, publications=[src.publication],
            max_window_bytes=window, max_windows=max_windows, columnar=columnar, reader=reader,
            accept_incomplete=accept_incomplete, accept_source_change=accept_source_change,
        ).run(time.monotonic())  # fmt: skip


def drain_app(src: Source, lake_root: str, *args: str, fault: str | None = None) -> Any:
    """The application as a real process (its own JVM), as spark-submit would run it."""
    env = {**os.environ, "PGLOGREPL_SOURCE_DSN": src.dsn, **app_env()}
    env.pop("PGLOGREPL_FAULT", None)
    if fault:
        env["PGLOGREPL_FAULT"] = fault
    command = [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", src.slot,
               "--publication", src.publication, "--lake", lake_root, *args]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def summary(result: Any) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def source_table(source: Source, table: str) -> list[tuple[Any, ...]]:
    rows = source.sql(f"SELECT * FROM {table}")
    return sorted((tuple(normalize(v) for v in row) for row in rows), key=repr)


def lake_table(lake_root: str, table: str) -> list[tuple[Any, ...]]:
    """``state/`` of a table as a multiset of normalized rows (NULL keys allowed)."""
    data = read_delta(f"{lake_root}/state/{table_dir(TableRef('public', table))}")
    rows = [tuple(normalize(row[n]) for n in data.column_names) for row in data.to_pylist()]
    return sorted(rows, key=repr)


ONE_WINDOW = 1 << 30


def source_columns(src: Source, table: str) -> list[str]:
    rows = src.sql(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum",
        (table,),
    )
    return [r[0] for r in rows]


def source_state(src: Source, table: str) -> list[tuple[Any, ...]]:
    names = ", ".join(f'"{n}"' for n in source_columns(src, table))
    rows = src.sql(f"SELECT {names} FROM {table} ORDER BY 1")
    return [tuple(normalize(v) for v in row) for row in rows]


def lake_state(lake_root: str, ref: TableRef, names: list[str]) -> list[tuple[Any, ...]]:
    table = read_delta(f"{lake_root}/state/{table_dir(ref)}").to_pylist()
    return sorted((tuple(normalize(r[n]) for n in names) for r in table), key=lambda r: r[0])


def assert_state_equals_source(src: Source, lake_root: str, ref: TableRef) -> None:
    names = source_columns(src, ref.name)
    lake, source = lake_state(lake_root, ref, names), source_state(src, ref.name)
    assert sorted(lake, key=repr) == sorted(source, key=repr), ref  # keys of several columns
    keys = all_changelog_keys(lake_root, [ref])
    assert len(keys) == len(set(keys))


def start_drain_app(
    src: Source,
    lake_root: str,
    *args: str,
    pause: Path | None = None,
    dsn: str | None = None,
    pause_at: str = "before_commit",
) -> Any:
    """The drain application started as a process of its own (``subprocess.Popen``); with
    ``pause``, it stops before each window's commit until a file ``go`` appears in that folder
    (``faults.pause('before_commit')``), leaving ``before_commit.<pid>`` there when it does.
    ``dsn`` connects as someone else than the cluster's superuser."""
    env = {**os.environ, "PGLOGREPL_SOURCE_DSN": dsn or src.dsn}
    env.pop("PGLOGREPL_FAULT", None)
    if pause is not None:
        env["PGLOGREPL_PAUSE"] = f"{pause_at}:{pause}"
    command = [sys.executable, "-m", "airflow_pglogrepl.spark.drain_app", "--slot", src.slot,
               "--publication", src.publication, "--lake", lake_root, *args]  # fmt: skip
    return subprocess.Popen(  # a session of its own: its JVM can be killed with it
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def lock_holders(src: Source) -> list[int]:
    """Backend pids of the sessions named as holding ``src``'s writer lock."""
    rows = src.sql(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
        (f"pglogrepl % {src.slot} %",),
    )
    return [int(r[0]) for r in rows]
