"""A small drain end to end through Airflow: what a user's first scheduled runs cost.

The issue-27 case: the product's drain DAG (``dags/pglogrepl_incremental_drain.py``) run with
``airflow dags test`` in a temporary AIRFLOW_HOME against a throwaway cluster, spark-submit on a
local master. Run 1 takes the initial snapshot of ``--tables`` tables of ``--rows`` rows; run 2
drains ``--changes`` changes spread over them (inserts, updates, deletes); run 3 has nothing to
drain. For each run: the wall time of ``airflow dags test`` (about 15 s of it is the command's
own start-up and its first task's start), the drain and upkeep tasks' own durations, and the
number of lines the run wrote to its console (its task logs).

``--repo`` points at another checkout (its ``dags/`` and its package) to measure before and after
a change with the same script. Not a test: ``python -m bench.bench_small_drain_dag``; results go
to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from psycopg import sql

from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, local_cluster

DAG_ID = "pglogrepl_incremental_drain"
HERE = Path(__file__).resolve().parent.parent


def airflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The ``airflow`` CLI in the checkout measured (``python -m`` imports from its cwd)."""
    return subprocess.run(
        [sys.executable, "-m", "airflow", *args], cwd=env["PGLOGREPL_BENCH_REPO"],
        env=env, capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip


def task_seconds(env: dict[str, str], task_id: str) -> float | None:
    """The newest run's duration of ``task_id``, read from the metadata DB by a child process
    (this process never imports Airflow with the bench's AIRFLOW_HOME)."""
    code = (
        "from airflow.models import TaskInstance as T\n"
        "from airflow.utils.session import create_session\n"
        "from sqlalchemy import select\n"
        "with create_session() as s:\n"
        f"    r = s.execute(select(T.duration).where(T.dag_id == {DAG_ID!r}, "
        f"T.task_id == {task_id!r}).order_by(T.start_date.desc()).limit(1)).first()\n"
        "print(r[0] if r and r[0] is not None else '')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=env["PGLOGREPL_BENCH_REPO"], check=False).stdout.strip()  # fmt: skip
    return round(float(out), 2) if out else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=3000)
    parser.add_argument("--repo", type=Path, default=HERE)
    parser.add_argument("--keep-logs", type=Path, help="write each run's console here")
    args = parser.parse_args()
    repo = args.repo.resolve()
    names = [f"t{i:02d}" for i in range(args.tables)]
    per_table = max(1, args.changes // (3 * args.tables))
    with (
        local_cluster("bench-small-dag", LOGICAL_SETTINGS) as cluster,
        tempfile.TemporaryDirectory(prefix="pglogrepl-bench-airflow-") as home,
    ):
        cluster.create_database("shop")
        with cluster.connect("shop") as conn:
            for name in names:
                conn.execute(sql.SQL(
                    "CREATE TABLE {} (id int PRIMARY KEY, v text, n numeric(12,2), at timestamptz)"
                ).format(sql.Identifier(name)))  # fmt: skip
                conn.execute(sql.SQL(
                    "INSERT INTO {} SELECT g, 'v' || g, g * 1.5, now() "
                    "FROM generate_series(1, %s) g"
                ).format(sql.Identifier(name)), (args.rows,))  # fmt: skip
            conn.execute(sql.SQL("CREATE PUBLICATION shop_lake FOR TABLE {}").format(
                sql.SQL(", ").join(map(sql.Identifier, names))))  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__API_AUTH__JWT_SECRET": "bench-only-secret-0123456789abcdef0123",
            "AIRFLOW_CONN_SHOP": cluster.airflow_uri("shop"),
            "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "PGLOGREPL_LAKE": str(Path(home) / "lake"),
            "PGLOGREPL_BENCH_REPO": str(repo),
        }
        migrated = airflow(env, "db", "migrate")
        if migrated.returncode != 0:
            raise SystemExit(migrated.stderr[-3000:])
        conf = json.dumps({"postgres_conn_id": "shop", "slot": "shop_lake",
                           "publications": ["shop_lake"]})  # fmt: skip
        rows: list[dict[str, Any]] = []

        def run(label: str, changes: int) -> None:
            began = time.perf_counter()
            done = airflow(env, "dags", "test", DAG_ID, "-c", conf)
            wall = round(time.perf_counter() - began, 2)
            console = done.stdout + done.stderr
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                (args.keep_logs / f"{label.split()[0]}.log").write_text(console)
            if done.returncode != 0:
                raise SystemExit(f"{label}: airflow dags test failed\n{console[-4000:]}")
            rows.append({"run": label, "changes": changes, "wall_s": wall,
                         "drain_s": task_seconds(env, "drain"),
                         "upkeep_s": task_seconds(env, "upkeep"),
                         "console_lines": len(console.splitlines())})  # fmt: skip

        run("1 initial snapshot", 0)
        with cluster.connect("shop") as conn:
            for name in names:
                table = sql.Identifier(name)
                top = args.rows
                conn.execute(sql.SQL(
                    "INSERT INTO {} SELECT g, 'new', g, now() "
                    "FROM generate_series(%s::int, %s::int) g"
                ).format(table), (top + 1, top + per_table))  # fmt: skip
                conn.execute(sql.SQL("UPDATE {} SET v = 'upd' WHERE id <= %s").format(table),
                             (per_table,))  # fmt: skip
                conn.execute(sql.SQL("DELETE FROM {} WHERE id > %s AND id <= %s").format(table),
                             (per_table, 2 * per_table))  # fmt: skip
        run("2 small drain", 3 * per_table * len(names))
        run("3 nothing to drain", 0)
    print(f"\nsmall drain through Airflow ({args.tables} tables, repo {repo})")
    print(f"{'run':<22}{'changes':>8}{'wall s':>8}{'drain s':>9}{'upkeep s':>9}"
          f"{'console lines':>14}")  # fmt: skip
    for r in rows:
        print(f"{r['run']:<22}{r['changes']:>8}{r['wall_s']:>8}{r['drain_s']!s:>9}"
              f"{r['upkeep_s']!s:>9}{r['console_lines']:>14}")  # fmt: skip


if __name__ == "__main__":
    main()
