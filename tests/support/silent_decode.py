"""A transaction the walsender decodes for a while without sending anything: its rows are all
rejected by a publication's row filter that is expensive to evaluate.

While a walsender decodes such a transaction it sends nothing, and reads its client's messages
(so answers a request to reply) only every hundred changes once half its
``wal_sender_timeout`` has passed since it last did (every hundred changes when the timeout is
0): the stream is silent for as long as that takes. The filter's cost (an ``md5`` of ``REPEAT``
copies of a row's ``pad``) grows with ``pad``'s length, faster in a walsender than in a query
(each row's copies are allocated afresh), so the decoding time is set by the number of rows,
from the cost of decoding a sample measured first on the same server rather than assumed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator

import psycopg
from psycopg import sql

from airflow_pglogrepl.testing.wait import wait_until

REPEAT = 100_000
# Every row is rejected: an md5 is 32 hex digits, never this.
SLOW_FILTER = sql.SQL("md5(repeat(pad, {})) = 'never'").format(sql.Literal(REPEAT))
SAMPLES, SAMPLE_ROWS = 5, 15
_probes = itertools.count(1)


def create_filtered_publication(dsn: str, publication: str, table: str) -> None:
    """``table`` (``id int``, ``pad text``) and ``publication`` of its inserts behind
    ``SLOW_FILTER``; and the same pair suffixed ``_probe``, whose decoding ``decode_cost_s``
    measures (outside ``publication``, a stream of it skips their rows at no cost)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for suffix in ("", "_probe"):
            name, pub = sql.Identifier(table + suffix), sql.Identifier(publication + suffix)
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, pad text)").format(name))
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WHERE ({})"
                                 " WITH (publish = 'insert')").format(pub, name,
                                                                      SLOW_FILTER))  # fmt: skip


def decode_cost_s(dsn: str, publication: str, table: str, pad_bytes: int) -> float:
    """Seconds the server's logical decoding spends on one row of ``pad_bytes`` behind
    ``SLOW_FILTER``: the least of ``SAMPLES`` measurements, each of ``SAMPLE_ROWS`` rows of the
    probe table decoded through a temporary slot (dropped with its session). A busy machine
    (the suite's other worker) makes a measurement slower, never faster: the least is the
    closest to what the decoding costs. A measurement made slower still makes the transaction
    written from it shorter than asked (fewer rows), by as much as a third seen on the suite's
    two cores: a test that needs at least some duration asks for half as much again."""
    probe = f"probe_{os.getpid()}_{next(_probes)}"
    probe_table = sql.Identifier(f"{table}_probe")
    costs = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', true)", (probe,))
        for _ in range(SAMPLES):
            conn.execute(sql.SQL("INSERT INTO {t} SELECT g, repeat('x', %s) FROM generate_series("
                                 "(SELECT coalesce(max(id), 0) + 1 FROM {t}),"
                                 " (SELECT coalesce(max(id), 0) + %s FROM {t})) g").format(
                         t=probe_table), (pad_bytes, SAMPLE_ROWS))  # fmt: skip
            began = time.monotonic()
            conn.execute("SELECT count(*) FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
                         " 'proto_version', '1', 'publication_names', %s)",
                         (probe, f"{publication}_probe"))  # fmt: skip
            costs.append((time.monotonic() - began) / SAMPLE_ROWS)
    return min(costs)


def write_silent_transaction(
    dsn: str,
    publication: str,
    table: str,
    seconds: float,
    *,
    pad_bytes: int,
    first_id: int = 1,
    cost_s: float | None = None,
) -> int:
    """One transaction of rows into ``table`` that ``publication`` rejects, enough for their
    decoding to take about ``seconds``; returns how many rows it wrote. ``cost_s``: a row's
    ``decode_cost_s`` measured before (its temporary slot waits for every open transaction)."""
    if cost_s is None:
        cost_s = decode_cost_s(dsn, publication, table, pad_bytes)
    rows = max(1, round(seconds / cost_s))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, repeat('x', %s)"
                             " FROM generate_series(%s::int, %s) g").format(sql.Identifier(table)),
                     (pad_bytes, first_id, first_id + rows - 1))  # fmt: skip
    return rows


# A stream's options for ``filtered_slot``'s publication.
FILTERED_OPTIONS = {"proto_version": "1", "publication_names": '"fpub"', "messages": "false"}


@contextlib.contextmanager
def filtered_slot(dsn: str, slot: str) -> Iterator[None]:
    """``slot``, and a publication ``fpub`` of table ``f`` behind ``SLOW_FILTER`` and of table
    ``ok`` without one. The slot is dropped afterwards, once free: a test that failed may have
    left a walsender decoding."""
    create_filtered_publication(dsn, "fpub", "f")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ok (id int PRIMARY KEY)")
        conn.execute("ALTER PUBLICATION fpub ADD TABLE ok")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            held = "SELECT active FROM pg_replication_slots WHERE slot_name = %s"
            wait_until(lambda: not conn.execute(held, (slot,)).fetchone()[0],  # type: ignore[index]
                       what=f"slot {slot} free", timeout=60)  # fmt: skip
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
