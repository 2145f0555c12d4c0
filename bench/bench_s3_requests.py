"""Object storage: what a drain run costs on S3 against the same run on a local lake, and the
requests it makes.

``--tables`` tables of ``--rows`` rows are published; two slots created before the rows drain
the same WAL, one into a local lake and one into a bucket of the S3 API server on loopback (moto's
standalone server, as the tests use; it counts every request it answers). Each lake has a first
run (every table's first state), then ``--changed`` tables get ``--changes`` changes each and
both lakes run again, then once more with nothing to drain. A run is what the drain DAG's
tasks do, in this process, under the lake's writer lock: the drain (``Drain``), the merge
(``materialize``; every merge of this workload needs no JVM) and the upkeep (``lake.upkeep``).

Printed: each step's seconds on both lakes, the ratio, and the S3 requests of each step by kind
(LIST, GET, HEAD, PUT, DELETE). moto serves from threads of this process, so its own CPU is in
the S3 figures: they bound what the requests cost, they do not predict S3's latency.

Not a test: ``python -m bench.bench_s3_requests``; the result goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from typing import Any

from psycopg import sql

from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.upkeep import upkeep
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster
from airflow_pglogrepl.testing.s3 import S3Server

PUBLICATION = "many"
STEPS = ("drain", "merge", "upkeep")
KINDS = ("LIST", "GET", "HEAD", "PUT", "DELETE")


def no_spark() -> Any:
    raise AssertionError("a merge of this workload needed Spark")


def one_run(dsn: str, slot: str, lake_root: str, server: S3Server | None) -> dict[str, Any]:
    """One run's seconds per step, and on S3 its requests per step."""
    from airflow_pglogrepl.pipeline.drain import Drain
    from airflow_pglogrepl.postgres.source import PgSource

    source = PgSource(dsn)
    result: dict[str, Any] = {}

    def step(name: str, work: Any) -> None:
        before = server.requests.copy() if server else Counter()
        began = time.perf_counter()
        work()
        result[name] = time.perf_counter() - began
        if server:
            result[f"{name}_requests"] = server.requests - before

    with source.writer_lock(slot, role="drain") as lock:
        lake = Lake(lake_root, slot, origins=source.column_origins, writer_check=lock.check)
        drained: list[Any] = []
        step("drain", lambda: drained.append(
            Drain(source=source, lake=lake, slot=slot, publications=[PUBLICATION],
                  max_window_bytes=64 << 20).run(time.monotonic())))  # fmt: skip
        step("merge", lambda: materialize(no_spark, lake))
        step("upkeep", lambda: upkeep(lake_root, slot, writer_check=lock.check))
    result["changes"] = drained[0].to_dict()["changes"]
    return result


def change(conn: Any, names: list[str], per_table: int) -> None:
    for name in names:
        table = sql.Identifier(name)
        conn.execute(sql.SQL("UPDATE {} SET n = n + 1 WHERE id <= %s").format(table),
                     (per_table,))  # fmt: skip


def report(label: str, local: dict[str, Any], s3: dict[str, Any]) -> None:
    total_local = sum(local[s] for s in STEPS)
    total_s3 = sum(s3[s] for s in STEPS)
    requests: Counter[str] = sum((s3[f"{s}_requests"] for s in STEPS), Counter())
    cells = " | ".join(f"{local[s]:.2f} / {s3[s]:.2f}" for s in STEPS)
    print(f"| {label} | {s3['changes']:,} | {cells} | {total_local:.2f} / {total_s3:.2f} | "
          f"{total_s3 / total_local:.1f} | {sum(requests.values()):,} |")  # fmt: skip
    for s in STEPS:
        counted = s3[f"{s}_requests"]
        kinds = ", ".join(f"{k} {counted[k]}" for k in KINDS if counted[k])
        print(f"|   {s} requests | | {kinds or 'none'} | | | | {sum(counted.values()):,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=2)
    parser.add_argument("--changes", type=int, default=100)
    args = parser.parse_args()
    server = S3Server()
    storage.use(server.store)
    with local_cluster("bench-s3", LOGICAL_SETTINGS) as cluster, cluster.connect() as conn, \
            tempfile.TemporaryDirectory(prefix="bench-s3-") as root:  # fmt: skip
        names = [f"t{i:03d}" for i in range(args.tables)]
        for name in names:
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, n int)")
                         .format(sql.Identifier(name)))  # fmt: skip
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(PUBLICATION), sql.SQL(", ").join(map(sql.Identifier, names))
            )
        )
        lakes = {"local": ("on_disk", f"{root}/lake", None),
                 "s3": ("on_s3", f"s3://{server.new_bucket()}/lake", server)}  # fmt: skip
        for slot, _, _ in lakes.values():
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for name in names:
            conn.execute(sql.SQL("INSERT INTO {} SELECT g, md5(g::text), g"
                                 " FROM generate_series(1, %s) g").format(sql.Identifier(name)),
                         (args.rows,))  # fmt: skip

        def both() -> tuple[dict[str, Any], dict[str, Any]]:
            runs = {k: one_run(cluster.dsn(), slot, uri, srv)
                    for k, (slot, uri, srv) in lakes.items()}  # fmt: skip
            return runs["local"], runs["s3"]

        print(f"{args.tables} tables of {args.rows} rows; {args.changed} of them then changed "
              f"({args.changes} updates each)\n")  # fmt: skip
        print("| run | changes | drain s (local / S3) | merge s | upkeep s | run s | S3/local "
              "| S3 requests |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        report("1 first states", *both())
        change(conn, names[: args.changed], args.changes)
        report(f"2 changes in {args.changed} tables", *both())
        report("3 nothing to drain", *both())
    server.stop()


if __name__ == "__main__":
    main()
