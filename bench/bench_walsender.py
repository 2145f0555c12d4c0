"""What caps the stream: the walsender's CPU for sending a slot's messages, beside the server's
decode alone, and the client's CPU for reading them (nothing decoded or written).

A slot is filled with ``--rows`` single-row changes (pgoutput messages under 100 bytes), then
read once through ``SlotStream`` (frames only: the batches are counted and dropped), while the
walsender's CPU is read from ``/proc``; then one peek of the same slot counts the messages
without sending them (the server's decode alone). If the walsender's CPU is well above that
decode, the stream's rate is the walsender's, whatever the client does. Not a test:
``python -m bench.bench_walsender``; the result goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import time

from airflow_pglogrepl.postgres.slot_stream import SlotStream
from airflow_pglogrepl.postgres.source import PgSource
from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster
from bench.bench_follow import process_cpu_s

OPTIONS = {"proto_version": "1", "publication_names": '"bench"', "messages": "false"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="single-row changes")
    parser.add_argument("--repeat", type=int, default=3, help="stream reads, one slot each")
    args = parser.parse_args()
    with local_cluster("bench-walsender", dict(LOGICAL_SETTINGS)) as cluster:
        cluster.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b text)")
        cluster.execute("CREATE PUBLICATION bench FOR TABLE t")
        slots = [f"bench_{i}" for i in range(args.repeat)]
        for slot in slots:
            cluster.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        step = 40_000
        for first in range(0, args.rows, step):
            cluster.execute("INSERT INTO t SELECT g, g, 'x' FROM generate_series(%s::int, %s) g",
                            (first, min(args.rows, first + step) - 1))  # fmt: skip
        source = PgSource(cluster.dsn())
        end = source.flush_lsn()
        print("\n| read | messages | wall s | walsender CPU s | client CPU s |")
        print("|---|---:|---:|---:|---:|")
        for slot in slots:
            start = source.get_slot(slot).confirmed_flush_lsn
            assert start is not None
            began, before = time.perf_counter(), os.times()
            messages = 0
            with SlotStream(source.connection_params(), slot, label="bench", start=start,
                            options=OPTIONS) as stream:  # fmt: skip
                (pid,) = cluster.execute("SELECT active_pid FROM pg_replication_slots WHERE "
                                         "slot_name = %s", (slot,))[0]  # fmt: skip
                sender = process_cpu_s(int(pid))
                for batch in stream.batches():
                    messages += len(batch.messages)
                    if batch.wal_end >= end:
                        break
                sender = process_cpu_s(int(pid)) - sender
            wall, after = time.perf_counter() - began, os.times()
            client = (after.user + after.system) - (before.user + before.system)
            print(f"| stream, frames only | {messages:,} | {wall:.2f} | {sender:.2f} | "
                  f"{client:.2f} |")  # fmt: skip
        began = time.perf_counter()
        (count,) = cluster.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'bench')", (slots[0],),
        )[0]  # fmt: skip
        print(f"| server decode alone (`count(*)` over one peek) | {count:,} | "
              f"{time.perf_counter() - began:.2f} | | |")  # fmt: skip
    print(f"\ncores: {os.cpu_count()}; load average: "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip


if __name__ == "__main__":
    main()
