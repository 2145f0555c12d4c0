"""Decoder benchmark: pgoutput messages per second, beside the server's own decode rate.

Loads 1,000,000 inserts and 250,000 updates of a 4-column table (in transactions of 10,000 rows)
into a throwaway cluster, then measures, on one core each:

- the server: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)``, which decodes
  the WAL and runs pgoutput but ships nothing to a client;
- the client fetch (psycopg reading the same rows), for scale;
- ``PgOutputStream`` on those rows already in memory: building the change records (values
  converted lazily, as a consumer that routes or converts columns in bulk would use them), and
  with every row's values converted to Python objects (``change.new`` / ``change.old``);
- the columnar decoder (``changelog.columnar``, protocol 1) on the same messages held as Arrow
  ``binary`` batches of ``--arrow-batch`` messages (as the ADBC fetch hands them over), all the
  way to typed changelog tables.

Each figure is the best of ``--repeat`` runs, server and decoder runs alternating so that both
meet the same load when the machine is shared. Not a test: run it with
``python -m bench.bench_decoder`` and record the result in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from airflow_pglogrepl.changelog.columnar import ColumnarDecoder
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import Change, PgOutputStream
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster

BATCH = 10_000
PEEK = (
    "SELECT {what} FROM pg_logical_slot_peek_binary_changes("
    "'bench', NULL, NULL, 'proto_version', %s, 'publication_names', 'bench')"
)


def decode_columnar(batches: Sequence[Any]) -> int:
    """Typed changelog rows from Arrow batches of messages (the columnar decoder)."""
    decoder = ColumnarDecoder({"proto_version": "1", "publication_names": "bench"})
    return sum(piece.rows.num_rows for batch in batches for piece in decoder.feed(batch))


def best_of(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """(shortest wall time, last result) over ``repeat`` runs."""
    best = float("inf")
    result = None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def decode_records(rows: Sequence[tuple[LSN, int, bytes]], version: int) -> int:
    count = 0
    for _ in PgOutputStream(proto_version=version).decode(rows):
        count += 1
    return count


def decode_values(rows: Sequence[tuple[LSN, int, bytes]], version: int) -> int:
    count = 0
    for event in PgOutputStream(proto_version=version).decode(rows):
        if isinstance(event, Change):
            event.new  # noqa: B018 -- converting the values is what is measured
            event.old  # noqa: B018
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inserts", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--proto-version", type=int, default=1, choices=[1, 2, 3, 4])
    parser.add_argument("--arrow-batch", type=int, default=50_000, help="messages per batch")
    args = parser.parse_args()

    with local_cluster("bench-decoder", LOGICAL_SETTINGS) as cluster, cluster.connect() as conn:
        conn.execute(
            "CREATE TABLE bench (id bigint PRIMARY KEY, qty int, label text, at timestamptz)"
        )
        conn.execute("CREATE PUBLICATION bench FOR TABLE bench")
        conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
        started = time.perf_counter()
        for first in range(1, args.inserts + 1, BATCH):
            last = min(first + BATCH - 1, args.inserts)
            conn.execute(
                "INSERT INTO bench SELECT g, g %% 1000, 'row ' || g, now()"
                " FROM generate_series(%s::bigint, %s) g",
                (first, last),
            )
        for first in range(1, args.updates + 1, BATCH):
            last = min(first + BATCH - 1, args.updates)
            conn.execute(
                "UPDATE bench SET qty = qty + 1, label = label || '!' WHERE id BETWEEN %s AND %s",
                (first, last),
            )
        print(f"loaded {args.inserts:,} inserts + {args.updates:,} updates "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip

        version = str(args.proto_version)
        count_sql = PEEK.format(what="count(*)")

        def fetch() -> list[tuple[LSN, int, bytes]]:
            cur = conn.execute(PEEK.format(what="lsn::text, xid::text::bigint, data"), (version,))
            return [(LSN(lsn), xid, data) for lsn, xid, data in cur]

        fetch_s, rows = best_of(1, fetch)
        step = args.arrow_batch
        arrow_batches = [
            pa.array([data for _, _, data in rows[i : i + step]], pa.binary())
            for i in range(0, len(rows), step)
        ]
        columnar_s = float("inf")
        # server and decoder runs alternate, so both meet the same load on a shared machine
        server_s = records_s = values_s = float("inf")
        for _ in range(args.repeat):
            seconds, counted = best_of(1, lambda: conn.execute(count_sql, (version,)).fetchone()[0])
            server_s = min(server_s, seconds)
            seconds, events = best_of(1, lambda: decode_records(rows, args.proto_version))
            records_s = min(records_s, seconds)
            values_s = min(values_s, best_of(1, lambda: decode_values(rows, args.proto_version))[0])
            if args.proto_version == 1:
                columnar_s = min(columnar_s, best_of(1, lambda: decode_columnar(arrow_batches))[0])
        messages = int(counted)
        assert len(rows) == messages, (len(rows), messages)

    server_rate = messages / server_s
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"messages: {messages:,} (protocol {version}; {events:,} events out); "
          f"cores: {os.cpu_count()}; load average: {load}")  # fmt: skip
    print(f"server decode (count(*) over the peek): {server_s:6.2f} s  {server_rate:>11,.0f} msg/s")
    print(f"client fetch (psycopg, for scale):      {fetch_s:6.2f} s  "
          f"{messages / fetch_s:>11,.0f} msg/s")  # fmt: skip
    for label, seconds in (("decoder, records (lazy values)", records_s),
                           ("decoder, records + values", values_s),
                           ("columnar decoder, changelog tables", columnar_s)):  # fmt: skip
        if seconds == float("inf"):
            continue
        rate = messages / seconds
        print(f"{label + ':':39} {seconds:6.2f} s  {rate:>11,.0f} msg/s  "
              f"ratio to server {rate / server_rate:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
