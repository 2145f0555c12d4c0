"""The one-command demo (``make demo``): a cutover and a lake drain on embedded local clusters.

What it does, start to finish, on this machine alone (no Docker):

1. starts two throwaway PostgreSQL clusters on loopback: ``old`` (the current primary) and
   ``new`` (the one the application moves to);
2. loads pgbench's schema into ``shop`` on the old primary, copies the schema to the new one,
   creates the lake's publication, and starts a pgbench write load as the application role;
3. runs ``pglogrepl_incremental_drain`` once: its first run takes the initial snapshot (the
   demo's tables are small: copied in the task's own process, without Spark; the slot is
   created at the snapshot's exact point) while the load keeps writing;
4. runs ``pglogrepl_cutover`` with ``airflow dags test`` (preflight, publication, subscription,
   ready and lag gates, write fence, catch-up to the fence LSN, sequence sync, parity, finalize);
5. runs ``pglogrepl_incremental_drain`` again: it drains what was written since the snapshot;
6. prints what happened (per-gate timings, LSNs, parity, windows drained, rows in the lake) and
   stops everything. Every run starts from nothing, so it works again when run twice.

``--s3`` keeps the lake in a bucket of an S3 API server started on loopback (moto's standalone
server, as the tests use): the DAG names the store by an Airflow connection of type ``aws``,
and the lake is read back from the bucket through deltalake and Spark.
``--summary FILE`` also writes the summary as JSON (the test suite checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from airflow_pglogrepl.testing.pgcluster import LOGICAL_SETTINGS, PgCluster, start_cluster  # noqa: E402

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.cut import Cut
    from airflow_pglogrepl.lake.storage import ObjectStore

DB = "shop"
APP_ROLE = "shop_app"
TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]
CUTOVER_DAG = "pglogrepl_cutover"
DRAIN_DAG = "pglogrepl_incremental_drain"


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Demo:
    def __init__(self, base: Path, scale: int, load_rate: int) -> None:
        self.base = base
        self.scale = scale
        self.load_rate = load_rate
        self.clusters: list[PgCluster] = []
        self.load: subprocess.Popen[str] | None = None
        self.app_password = "demo-" + os.urandom(6).hex()
        self.home = base / "airflow"
        self.lake = str(base / "lake")
        self.env: dict[str, str] = {}
        self.store: ObjectStore | None = None
        self.s3_server: Any = None

    def start_s3(self) -> None:
        """An S3 API server on loopback and a bucket for the lake."""
        from airflow_pglogrepl.testing.s3 import S3Server

        self.s3_server = S3Server()
        self.store = self.s3_server.store
        self.lake = f"s3://{self.s3_server.new_bucket()}/lakes/shop"
        say(f"S3 API server on {self.s3_server.endpoint}; the lake is {self.lake}")

    def lake_objects(self) -> int:
        """Objects under the lake's prefix in the bucket."""
        bucket, _, prefix = self.lake.removeprefix("s3://").partition("/")
        return len(self.s3_server.keys(bucket, prefix + "/"))

    # -- set-up -----------------------------------------------------------------------------

    def start_clusters(self) -> tuple[PgCluster, PgCluster]:
        settings = {**LOGICAL_SETTINGS, "fsync": "on"}
        old = start_cluster("old", self.base / "old", settings)
        self.clusters.append(old)
        new = start_cluster("new", self.base / "new", settings)
        self.clusters.append(new)
        say(f"clusters up: old primary on port {old.port}, new primary on port {new.port}")
        return old, new

    def load_schema(self, old: PgCluster, new: PgCluster) -> None:
        for cluster in (old, new):
            cluster.create_database(DB)
        self._pgbench(old, ["-i", "-s", str(self.scale), "-q", "-I", "dtp"])
        # pgbench_history has no key: a full replica identity lets UPDATE/DELETE replicate and
        # gives the lake a row identity. A bigserial gives the cutover a sequence to sync.
        old.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial", dbname=DB)
        old.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL", dbname=DB)
        from psycopg import sql

        old.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(APP_ROLE), sql.Literal(self.app_password)
            ),
            dbname=DB,
        )
        old.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {APP_ROLE}", dbname=DB)
        old.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {APP_ROLE}", dbname=DB)
        schema = subprocess.run(
            [str(old.bindir / "pg_dump"), "--schema-only", "--no-owner", "--no-privileges",
             "-d", old.dsn(DB)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        subprocess.run(
            [str(new.bindir / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-d", new.dsn(DB)],
            input=schema, capture_output=True, text=True, check=True,
        )  # fmt: skip
        old.execute(f"CREATE PUBLICATION lake_pub FOR TABLE {', '.join(TABLES)}", dbname=DB)
        self._pgbench(old, ["-i", "-s", str(self.scale), "-q", "-I", "gv"])
        rows = old.execute("SELECT count(*) FROM pgbench_accounts", dbname=DB)[0][0]
        say(f"schema loaded: pgbench scale {self.scale} ({rows} accounts), lake publication")

    def start_load(self, old: PgCluster) -> None:
        script = self.base / "load.sql"
        script.write_text(
            "\\set aid random(1, 100000 * :scale)\n\\set delta random(-5000, 5000)\n"
            "UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\n"
            "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
            "VALUES (1, 1, :aid, :delta, CURRENT_TIMESTAMP);\n"
        )
        env = {**os.environ, "PGPASSWORD": self.app_password}
        self.load = subprocess.Popen(
            [str(old.bindir / "pgbench"), "-n", "-c", "2", "-T", "3600", "-R", str(self.load_rate),
             "-f", str(script), "-h", old.host, "-p", str(old.port), "-U", APP_ROLE, DB],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        say(f"write load running: pgbench as {APP_ROLE}, about {self.load_rate} transactions/s")

    def stop_load(self) -> None:
        if self.load is not None and self.load.poll() is None:
            self.load.terminate()
            self.load.wait(timeout=30)

    def _pgbench(self, cluster: PgCluster, args: list[str]) -> None:
        env = {**os.environ, "PGPASSWORD": cluster.password}
        subprocess.run(
            [str(cluster.bindir / "pgbench"), *args, "-h", cluster.host, "-p", str(cluster.port),
             "-U", cluster.superuser, DB],
            env=env, check=True, capture_output=True,
        )  # fmt: skip

    # -- Airflow ----------------------------------------------------------------------------

    def airflow_env(self, old: PgCluster, new: PgCluster) -> None:
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home}/airflow.db",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(24).hex(),
            "AIRFLOW_CONN_PGLOGREPL_PUBLISHER": old.airflow_uri(DB),
            "AIRFLOW_CONN_PGLOGREPL_SUBSCRIBER": new.airflow_uri(DB),
            "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "PGLOGREPL_SPARK_CONN_ID": "spark_local",
            "PGLOGREPL_LAKE": self.lake,
            "PGLOGREPL_FENCE_GRACE_S": "2",
        }
        if self.store is not None:  # the store's keys in an aws connection, as a user keeps them
            self.env["PGLOGREPL_LAKE_CONN_ID"] = "lake_store"
            self.env["AIRFLOW_CONN_LAKE_STORE"] = json.dumps({
                "conn_type": "aws", "login": self.store.access_key_id,
                "password": self.store.secret_access_key,
                "extra": {"endpoint_url": self.store.endpoint_url, "region_name": "us-east-1"},
            })  # fmt: skip
        self.home.mkdir(parents=True, exist_ok=True)
        self.airflow("db", "migrate")
        say("Airflow metadata database ready")

    def airflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env, capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-6000:]
            raise RuntimeError(f"airflow {' '.join(args[:3])} failed:\n{tail}")
        return result

    def run_dag(self, dag_id: str, conf: dict[str, Any]) -> dict[str, Any]:
        began = time.monotonic()
        self.airflow("dags", "test", dag_id, "-c", json.dumps(conf))
        report = self.run_report(dag_id)
        report["seconds"] = round(time.monotonic() - began, 1)
        return report

    def run_report(self, dag_id: str) -> dict[str, Any]:
        """Task timings and return values of the DAG's newest run, from the metadata DB."""
        code = f"""
import json
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
from sqlalchemy import select
with create_session() as s:
    run = s.scalars(select(DagRun).where(DagRun.dag_id == {dag_id!r})
                    .order_by(DagRun.id.desc()).limit(1)).one()
    tis = s.scalars(select(TaskInstance).where(TaskInstance.dag_id == {dag_id!r},
                    TaskInstance.run_id == run.run_id)).all()
    out = {{"state": str(run.state), "tasks": {{}}}}
    for ti in sorted(tis, key=lambda t: (t.start_date is None, t.start_date)):
        xcom = s.scalars(select(XComModel.value).where(XComModel.dag_id == {dag_id!r},
               XComModel.run_id == run.run_id, XComModel.task_id == ti.task_id,
               XComModel.key == "return_value")).first()
        out["tasks"][ti.task_id] = {{"state": str(ti.state), "seconds": ti.duration,
                                    "result": xcom}}
print(json.dumps(out, default=str))
"""
        result = subprocess.run(
            [sys.executable, "-c", code], env=self.env, capture_output=True, text=True, check=True
        )
        report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return report

    def stop(self) -> None:
        self.stop_load()
        if self.s3_server is not None:
            self.s3_server.stop()
        for cluster in reversed(self.clusters):
            try:
                cluster.stop()
            except Exception as exc:  # keep stopping the others
                say(f"could not stop cluster {cluster.name}: {exc}")


def lake_cut(lake: str, slot: str) -> Cut:
    """The versions of every ``state/`` table at one lake position: Delta has no transaction
    across tables, so each table's latest version could show a source transaction in one table
    and not yet in another (the merges commit table by table)."""
    from airflow_pglogrepl.lake.cut import consistent_cut

    return consistent_cut(lake, slot=slot)


def lake_rows(cut: Cut) -> dict[str, int]:
    """Rows of each ``state/`` Delta table of the cut, read through ``deltalake`` (no JVM)."""
    from airflow_pglogrepl.lake.cut import read_cut

    return {name: table.num_rows for name, table in read_cut(cut).items()}


def lake_rows_spark_sql(cut: Cut) -> dict[str, int]:
    """The same counts through Spark SQL, over the same versions (a local session with Delta)."""
    from airflow_pglogrepl.lake.cut import read_cut_spark
    from airflow_pglogrepl.spark.session import local_session

    spark = local_session("pglogrepl-demo-reader")
    try:
        counts = {}
        for name, frame in read_cut_spark(spark, cut).items():
            frame.createOrReplaceTempView("cut_table")
            counts[name] = int(spark.sql("SELECT count(*) FROM cut_table").collect()[0][0])
        return counts
    finally:
        spark.stop()


def print_summary(summary: dict[str, Any]) -> None:
    print("\n=== airflow-pglogrepl demo: what happened ===")
    for name in ("snapshot", "cutover", "drain"):
        report = summary.get(name)
        if not report:
            continue
        title = {"snapshot": "drain DAG, first run", "drain": "drain DAG, second run"}
        print(f"\n{title.get(name, name + ' DAG')}: {report['state']} in {report['seconds']} s")
        for task, info in report["tasks"].items():
            seconds = info["seconds"]
            timing = f"{seconds:7.2f} s" if isinstance(seconds, int | float) else "      -  "
            print(f"  {task:<28} {info['state']:<10} {timing}  {_brief(info['result'])}")
    print(
        f"\nrows in the lake's state/ Delta tables ({summary.get('lake')}) at position "
        f"{summary.get('lake_position')}, read back two ways, and on the old primary:"
    )
    print(f"  {'table':<32} {'deltalake':>9} {'Spark SQL':>9} {'source':>9}")
    for table, rows in summary["lake_rows"].items():
        spark_rows = summary.get("lake_rows_spark_sql", {}).get(table, "?")
        print(
            f"  {table:<32} {rows:>9} {spark_rows:>9} {summary['source_rows'].get(table, '?'):>9}"
        )
    print()


def _brief(result: Any) -> str:
    if not isinstance(result, dict):
        return "" if result is None else str(result)[:80]
    keys = ("status", "consistent_point", "rows", "fence_lsn", "confirmed_flush_lsn_after",
            "windows", "changes", "lag_bytes", "checked", "passed", "changed", "compacted",
            "files_removed")  # fmt: skip
    parts = [
        f"{k}={result[k]}" for k in keys if k in result and not isinstance(result[k], dict | list)
    ]
    return ", ".join(parts)[:110]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scale", type=int, default=1, help="pgbench scale (100,000 rows each)")
    parser.add_argument("--load-rate", type=int, default=50, help="load transactions per second")
    parser.add_argument("--summary", type=Path, help="also write the summary here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--s3", action="store_true", help="keep the lake in a bucket of an S3 server on loopback"
    )
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="pglogrepl-demo-"))
    os.chmod(base, 0o755)
    demo = Demo(base, args.scale, args.load_rate)
    summary: dict[str, Any] = {"work_dir": str(base)}
    try:
        if args.s3:
            demo.start_s3()
        old, new = demo.start_clusters()
        demo.load_schema(old, new)
        demo.airflow_env(old, new)
        demo.start_load(old)
        drain_conf = {
            "slot": "lake_shop",
            "publications": ["lake_pub"],
            "max_window_bytes": 4 << 20,
        }
        say(
            "first incremental-drain run: initial snapshot (small tables: in process, no Spark), "
            "under load ..."
        )
        summary["snapshot"] = demo.run_dag(DRAIN_DAG, drain_conf)
        say("running the cutover DAG (airflow dags test) ...")
        summary["cutover"] = demo.run_dag(
            CUTOVER_DAG,
            {
                "tables": [f"public.{t}" for t in TABLES],
                "fence_roles": [APP_ROLE],
                "require_approval": False,  # the demo approves itself
                "sequence_margin": 1000,
            },
        )
        demo.stop_load()
        say("second incremental-drain run: what was written since the snapshot ...")
        summary["drain"] = demo.run_dag(DRAIN_DAG, drain_conf)
        from airflow_pglogrepl.lake import storage

        with storage.using(demo.store):  # this process reads the lake as the tasks wrote it
            cut = lake_cut(demo.lake, str(drain_conf["slot"]))
            summary["lake_position"] = str(cut.position)
            summary["lake_rows"] = lake_rows(cut)
            summary["lake_rows_spark_sql"] = lake_rows_spark_sql(cut)
        summary["lake"] = demo.lake
        if demo.store is not None:
            summary["lake_objects"] = demo.lake_objects()
        from psycopg import sql

        count = sql.SQL("SELECT count(*) FROM {}")
        summary["source_rows"] = {
            f"public.{t}": old.execute(count.format(sql.Identifier(t)), dbname=DB)[0][0]
            for t in TABLES
        }
        print_summary(summary)
    except Exception as exc:
        say(f"FAILED: {exc}")
        summary["error"] = str(exc)
        return 1
    finally:
        demo.stop()
        if args.summary:
            args.summary.write_text(json.dumps(summary, indent=1, default=str))
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        say("clusters stopped" + ("" if args.keep else ", work directory removed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
