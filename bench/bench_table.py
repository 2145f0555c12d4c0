"""The table the snapshot and backfill benchmarks copy, and the ``psql`` yardstick they are
measured against: one load and one command, so their figures compare."""

from __future__ import annotations

import os
import subprocess
from typing import Any

COPY_OUT = "COPY bench TO STDOUT"


def load_bench_table(cluster: Any, rows: int) -> int:
    """``bench`` (a bigint key, an int, a short text, a timestamptz) with ``rows`` rows,
    vacuumed and analyzed; its heap size in bytes."""
    with cluster.connect() as conn:
        conn.execute(
            "CREATE TABLE bench (id bigint PRIMARY KEY, qty int, label text, at timestamptz)"
        )
        conn.execute(
            "INSERT INTO bench SELECT g, g %% 1000, 'label ' || g,"
            " timestamptz '2026-01-01' + g * interval '1 second'"
            " FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE bench")
        return int(conn.execute("SELECT pg_relation_size('bench')").fetchone()[0])


def psql_copy(cluster: Any, *, out: Any = subprocess.DEVNULL) -> bytes | None:
    """``psql -c "COPY bench TO STDOUT"`` into ``out`` (``subprocess.PIPE``: its output is
    returned); the password through the environment, never argv."""
    env = {**os.environ, "PGPASSWORD": cluster.password}
    argv = [str(cluster.bindir / "psql"), "-h", cluster.host, "-p", str(cluster.port),
            "-U", cluster.superuser, "-d", "postgres", "-X", "-q", "-c", COPY_OUT]  # fmt: skip
    done = subprocess.run(argv, env=env, stdout=out, check=True)
    return done.stdout if out is subprocess.PIPE else None
