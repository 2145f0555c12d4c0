"""The incremental-drain DAG through ``airflow dags test``: spark-submit on a local master."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.support.airflow import set_airflow_connection
from tests.support.drain import lake_rows, source_rows
from tests.support.paths import REPO

# The DAG's task runs spark-submit (a JVM).
pytestmark = pytest.mark.spark

DAG_ID = "pglogrepl_incremental_drain"


def dags_test(conf: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``airflow dags test`` of the product's DAG (the repository's dags/ folder)."""
    return subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "test", DAG_ID, "-c", json.dumps(conf)],
        capture_output=True,
        text=True,
        env={**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), **env},
        timeout=600,
        check=False,
    )


def lineage_env(events: Path) -> dict[str, str]:
    """OpenLineage's file transport: every event of the run, one JSON per line, in ``events``."""
    transport = {"type": "file", "log_file_path": str(events), "append": True}
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "pglogrepl-tests"}  # fmt: skip


def completed(events: Path, task_id: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(inputs, outputs)`` as ``(namespace, name)`` of the last COMPLETE event of a task."""
    found = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    done = [e for e in found if e["eventType"] == "COMPLETE"
            and e["job"]["name"].endswith(f".{task_id}")]  # fmt: skip
    assert done, f"no COMPLETE event of {task_id}: {[e['job']['name'] for e in found]}"
    last = done[-1]
    for dataset in last["outputs"]:  # every output carries its schema and its column lineage
        assert dataset["facets"]["schema"]["fields"], dataset
        assert dataset["facets"]["columnLineage"]["fields"]["id"]["inputFields"], dataset
    return ([(d["namespace"], d["name"]) for d in last["inputs"]],
            [(d["namespace"], d["name"]) for d in last["outputs"]])  # fmt: skip


def latest_xcom(task_id: str, key: str = "return_value") -> Any:
    """The newest XCom a task of the DAG pushed (``airflow dags test`` picks its own run id)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.execute(
            select(XComModel.value)
            .where(XComModel.dag_id == DAG_ID, XComModel.task_id == task_id, XComModel.key == key)
            .order_by(XComModel.timestamp.desc())
            .limit(1)
        ).first()
    assert row is not None, f"no XCom {key!r} from {DAG_ID}.{task_id}"
    return row[0]


def asset_events(uri: str) -> list[dict[str, Any]]:
    """The extra of each event of the Asset ``uri`` in the metadata database, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == uri).order_by(AssetEvent.id)
        ).all()  # fmt: skip
    return [dict(row[0]) for row in rows]


def delta_scan_current(uri: str) -> list[tuple[Any, ...]]:
    """The current versions of a history, as the source's rows."""
    from airflow_pglogrepl.lake.delta import scan

    rows = scan(uri, where='"_is_current"').to_pylist()
    return [(r["id"], r["amount"], r["note"]) for r in rows]


@pytest.fixture
def drain_source(publisher: PgCluster) -> str:
    """A database with a published table (no slot: the DAG's snapshot creates it); returns the
    connection id."""
    db = "drain_dag"
    publisher.create_database(db)
    publisher.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(12, 2), note text)", dbname=db
    )
    publisher.execute("CREATE PUBLICATION lake_dag_pub FOR TABLE orders", dbname=db)
    set_airflow_connection("drain_dag_source", publisher.airflow_uri(db))
    return "drain_dag_source"


class StatsdListener:
    """A StatsD server on loopback: every datagram Airflow's ``Stats`` sends while it runs,
    read in a thread of its own (a UDP buffer left unread drops what overflows it)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.port = int(self.socket.getsockname()[1])
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.socket.recv(65536)
            except TimeoutError:
                continue
            self.lines += data.decode(errors="replace").splitlines()

    def env(self) -> dict[str, str]:
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST":
                "127.0.0.1", "AIRFLOW__METRICS__STATSD_PORT": str(self.port),
                "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"}  # fmt: skip

    def values(self, name: str) -> list[tuple[float, str]]:
        """``(value, kind)`` of each datagram of metric ``name`` received so far."""
        found = []
        for line in list(self.lines):
            metric, _, rest = line.partition(":")
            if metric == name:
                value, _, kind = rest.partition("|")
                found.append((float(value), kind.split("|")[0]))
        return found

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.socket.close()


def test_drain_dag_end_to_end_with_spark_submit(
    airflow_home: Path, publisher: PgCluster, drain_source: str, tmp_path: Path
) -> None:
    db = "drain_dag"
    publisher.execute(
        "INSERT INTO orders SELECT g, g * 1.5, 'n' || g FROM generate_series(1, 3000) g", dbname=db
    )
    publisher.execute("UPDATE orders SET note = NULL WHERE id % 3 = 0", dbname=db)
    publisher.execute("DELETE FROM orders WHERE id % 5 = 0", dbname=db)
    lake_root = tmp_path / "lake"
    statsd = StatsdListener()
    env = {
        "PGLOGREPL_LAKE": str(lake_root),
        "PGLOGREPL_SPARK_CONN_ID": "spark_local",
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        **statsd.env(),  # the provider's metrics, through Airflow's own Stats
    }
    conf = {
        "postgres_conn_id": drain_source,
        "slot": "lake_dag",
        "publications": ["lake_dag_pub"],
        "max_window_bytes": 64 * 1024,
        # the upkeep compacts a table from two small files on (the default waits for 20)
        "upkeep_max_files": 2,
        "upkeep_max_small_files": 2,
    }
    # First run: no slot, empty lake -> the initial snapshot creates the slot and copies the
    # table at its start; the drain after it finds nothing new and succeeds with zero changes.
    first = dags_test(conf, env)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    snapshot = latest_xcom("initial_snapshot")
    assert snapshot["committed"] is True, snapshot
    # ... so nothing was submitted: the worker told it was idle (no spark-submit)
    idle = latest_xcom("drain")
    assert idle["changes"] == 0 and idle["idle"] is True and idle["spark_start_s"] is None, idle
    assert "spark-submit skipped" in first.stdout + first.stderr
    from airflow_pglogrepl.tables import TableRef

    orders = TableRef("public", "orders")
    assert lake_rows(str(lake_root), orders) == source_rows(publisher, db, "orders")
    # Changes after the snapshot: the second run skips the snapshot and drains them.
    publisher.execute(
        "INSERT INTO orders SELECT g, g * 2.5, 'late' FROM generate_series(3001, 4000) g", dbname=db
    )
    publisher.execute("UPDATE orders SET note = 'upd' WHERE id % 7 = 0", dbname=db)
    publisher.execute("DELETE FROM orders WHERE id % 11 = 0", dbname=db)
    second = dags_test({**conf, "history": ["public.orders"]}, env)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert latest_xcom("initial_snapshot")["status"] == "exists"
    result = latest_xcom("drain")
    alive = [i for i in range(1, 4001) if not (i <= 3000 and i % 5 == 0)]
    expected = 1000 + sum(i % 7 == 0 for i in alive) + sum(i % 11 == 0 for i in alive)
    assert result["changes"] == expected and result["windows"] > 1, result
    assert result["idle"] is False
    confirmed = latest_xcom("drain", "confirmed_flush_lsn")
    assert confirmed == result["confirmed_flush_lsn_after"] != result["confirmed_flush_lsn_before"]
    slot = publisher.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'lake_dag'"
    )
    assert slot == [(confirmed,)]
    report = latest_xcom("lag_report")
    assert report["confirmed_flush_lsn"] == confirmed and report["wal_status"] == "reserved"
    assert lake_rows(str(lake_root), orders) == source_rows(publisher, db, "orders")
    # the drain emitted an Asset event of each lake table it changed, saying what it did; the
    # idle first run emitted none
    from airflow_pglogrepl.operators.assets import lake_table_asset

    for kind in ("changes", "state", "history"):
        *before, extra = asset_events(lake_table_asset(str(lake_root), orders, kind).uri)
        assert len(before) == (kind == "state"), before  # (the snapshot's copy: below)
        assert extra["table"] == "public.orders" and extra["kind"] == kind, extra
        assert extra["changes"] == expected and extra["lsn"] == confirmed, extra
        assert isinstance(extra["delta_version"], int), extra
    (copied, _) = asset_events(lake_table_asset(str(lake_root), orders, "state").uri)
    assert copied["rows"] == snapshot["rows"] and copied["lsn"] == snapshot["consistent_point"]
    current = delta_scan_current(str(lake_root / "history" / "public.orders"))
    assert sorted(current) == source_rows(publisher, db, "orders")
    # the upkeep ran after the drain: the windows' changelog files packed into one, the windows
    # table compacted, every table checkpointed; rows (above) and the position unchanged
    upkeep = {t["table"]: t for t in latest_xcom("upkeep")["tables"]}
    changes = upkeep["changes/public.orders"]
    assert changes["compacted"] and changes["files_before"] > 1 == changes["files_after"], changes
    assert upkeep["_pglogrepl/windows"]["compacted"], upkeep
    # a checkpoint at most checkpoint_every (10) versions old, the first one at the upkeep's
    assert all(t["checkpoint"] is not None and t["version_after"] - t["checkpoint"] < 10
               for t in upkeep.values()), upkeep  # fmt: skip
    assert changes["checkpoint"] == changes["version_after"], changes  # it had none before
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lsn import LSN

    assert Lake(str(lake_root), "lake_dag").position() == LSN(confirmed)
    # quiet logs: Spark's own INFO stays out of the task log (spark_log_level WARN), so what the
    # spark-submit runs wrote is the applications' progress lines and a few warnings
    for run in (first, second):
        console = run.stdout + run.stderr
        assert not re.search(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ", console), console[-3000:]
        spark_lines = [line for line in console.splitlines() if "SparkSubmitHook]" in line]
        assert len(spark_lines) <= 40, "\n".join(spark_lines)
    assert "Drain of slot lake_dag into" in second.stdout + second.stderr  # the closing paragraph
    # metrics (docs/reference/metrics.md), as a StatsD server received them
    statsd.close()
    name = "airflow.pglogrepl.lake_dag."
    assert statsd.values(name + "snapshot.rows") == [(snapshot["rows"], "c")]
    assert statsd.values(name + "drain.idle") == [(1.0, "g"), (0.0, "g")]
    assert statsd.values(name + "drain.changes") == [(float(expected), "c")]
    assert statsd.values(name + "wal_status")[-1] == (0.0, "g")  # reserved
    assert statsd.values(name + "retained_bytes") and statsd.values(name + "lag_bytes")
    assert [kind for _, kind in statsd.values(name + "upkeep")] == ["ms", "ms"]
    # the DSN's password never reached the task log or XCom
    password = publisher.params(db)["password"]
    for run in (first, second):
        assert password not in run.stdout + run.stderr
    assert password not in json.dumps(result) + json.dumps(snapshot) + json.dumps(upkeep)


@pytest.fixture(scope="module")
def standalone_master(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Spark standalone master and one worker (separate JVMs) on loopback, from pyspark."""
    from airflow_pglogrepl.operators.spark_submit import spark_home_env
    from airflow_pglogrepl.testing.pgcluster import free_port
    from airflow_pglogrepl.testing.wait import wait_until

    home = os.environ.get("SPARK_HOME") or spark_home_env()["SPARK_HOME"]
    spark_class = str(Path(home) / "bin" / "spark-class")
    work = tmp_path_factory.mktemp("spark-standalone")
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1"}
    logs = (work / "master.log").open("w"), (work / "worker.log").open("w")
    master = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(ui)],
        env=env, stdout=logs[0], stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
         "--host", "127.0.0.1", "--cores", "2", "--memory", "1g", "--webui-port",
         str(free_port()), "--work-dir", str(work / "work")],
        env=env, stdout=logs[1], stderr=subprocess.STDOUT,
    )  # fmt: skip

    def alive_workers() -> int:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as reply:
                return int(json.load(reply).get("aliveworkers", 0))
        except OSError:
            return 0

    try:
        wait_until(lambda: alive_workers() >= 1, timeout=120, what="a Spark worker registered")
        yield {"master": f"spark://127.0.0.1:{port}", "work": work / "work"}
    finally:
        for process in (worker, master):
            process.terminate()
        for process in (worker, master):
            process.wait(timeout=60)
        for log in logs:
            log.close()


def test_drain_on_a_standalone_cluster_ships_the_package(
    airflow_home: Path, publisher: PgCluster, standalone_master: Any, tmp_path: Path
) -> None:
    db = "drain_standalone"
    publisher.create_database(db)
    publisher.execute("CREATE TABLE items (id int PRIMARY KEY, v text)", dbname=db)
    publisher.execute("CREATE PUBLICATION lake_sa_pub FOR TABLE items", dbname=db)
    set_airflow_connection("drain_sa_source", publisher.airflow_uri(db))
    publisher.execute(
        "INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 500) g", dbname=db
    )
    publisher.execute("UPDATE items SET id = id + 1000 WHERE id <= 10", dbname=db)
    lake_root = tmp_path / "lake"
    host, port = standalone_master["master"].removeprefix("spark://").split(":")
    env = {
        "PGLOGREPL_LAKE": str(lake_root),
        "PGLOGREPL_SPARK_CONN_ID": "spark_standalone",
        "AIRFLOW_CONN_SPARK_STANDALONE": json.dumps(
            {"conn_type": "spark", "host": f"spark://{host}", "port": int(port)}
        ),
    }
    conf = {
        "postgres_conn_id": "drain_sa_source",
        "slot": "lake_sa",
        "publications": ["lake_sa_pub"],
        "max_window_bytes": 1 << 20,
        "small_merge_rows": 0,  # every merge by Spark, here on the cluster's executors
    }
    run = dags_test(conf, env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    # the snapshot copied the rows on the cluster's executors; the drain found nothing newer,
    # so it merged nothing and started no Spark at all
    assert latest_xcom("initial_snapshot")["committed"] is True
    first = latest_xcom("drain")
    assert first["changes"] == 0 and first["spark_start_s"] is None
    publisher.execute("UPDATE items SET v = 'changed' WHERE id % 3 = 0", dbname=db)
    publisher.execute("DELETE FROM items WHERE id % 7 = 0", dbname=db)
    run = dags_test(conf, env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    result = latest_xcom("drain")  # this time the merge runs on the cluster
    assert result["changes"] > 0 and result["master"] == standalone_master["master"]
    # The executors are the worker's processes and import the package from the zip that
    # spark-submit shipped (--py-files), not from this checkout.
    executors = result["executors"]
    assert executors and all(e["pid"] != os.getpid() for e in executors)
    assert all("airflow_pglogrepl.zip" in e["package"] for e in executors), executors
    from airflow_pglogrepl.tables import TableRef

    assert lake_rows(str(lake_root), TableRef("public", "items")) == source_rows(
        publisher, db, "items"
    )


def test_drain_dag_keeps_its_lake_on_s3_and_its_secret_out_of_sight(
    airflow_home: Path, publisher: PgCluster, s3_server: Any, tmp_path: Path
) -> None:
    """The same DAG with its lake in a bucket of the S3 server, the store named by an ``aws``
    connection: the snapshot (spark-submit), the drain and the upkeep all work on the bucket,
    the lake reads back through deltalake and Spark, and the store's secret is in no log and
    no XCom."""
    from airflow_pglogrepl.lake import storage
    from airflow_pglogrepl.lake.lake import Lake
    from airflow_pglogrepl.lsn import LSN
    from airflow_pglogrepl.tables import TableRef

    db = "drain_dag_s3"
    publisher.create_database(db)
    publisher.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)", dbname=db)
    publisher.execute("CREATE PUBLICATION lake_s3_pub FOR TABLE orders", dbname=db)
    publisher.execute(
        "INSERT INTO orders SELECT g, 'n' || g FROM generate_series(1, 500) g", dbname=db
    )
    set_airflow_connection("drain_s3_source", publisher.airflow_uri(db))
    lake_root = f"s3://{s3_server.new_bucket()}/lakes/orders"
    events = tmp_path / "lineage.jsonl"
    env = {
        **lineage_env(events),
        "PGLOGREPL_LAKE": lake_root,
        "PGLOGREPL_LAKE_CONN_ID": "lake_store",
        "AIRFLOW_CONN_LAKE_STORE": json.dumps(s3_server.connection()),
        "PGLOGREPL_SPARK_CONN_ID": "spark_local",
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
    }
    conf = {"postgres_conn_id": "drain_s3_source", "slot": "lake_s3",
            "publications": ["lake_s3_pub"], "upkeep_max_files": 2,
            "upkeep_max_small_files": 2}  # fmt: skip
    first = dags_test(conf, env)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    snapshot = latest_xcom("initial_snapshot")
    assert snapshot["committed"] is True, snapshot
    # the worker read the bucket's lake and found nothing to drain: no spark-submit
    assert latest_xcom("drain")["idle"] is True
    publisher.execute("UPDATE orders SET note = 'upd' WHERE id % 7 = 0", dbname=db)
    publisher.execute("DELETE FROM orders WHERE id % 11 = 0", dbname=db)
    second = dags_test({**conf, "history": ["public.orders"]}, env)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    result = latest_xcom("drain")
    assert result["changes"] == 71 + 45 and result["idle"] is False, result
    upkeep = latest_xcom("upkeep")
    bucket, _, prefix = lake_root.removeprefix("s3://").partition("/")
    keys = s3_server.keys(bucket, prefix)
    assert f"{prefix}/state/public.orders/_delta_log/00000000000000000000.json" in keys
    assert any(k.startswith(f"{prefix}/changes/public.orders/") for k in keys)
    orders = TableRef("public", "orders")
    with storage.using(s3_server.store):
        assert lake_rows(lake_root, orders) == source_rows(publisher, db, "orders")
        assert Lake(lake_root, "lake_s3").position() == LSN(result["confirmed_flush_lsn_after"])
    # the store's secret: masked wherever Airflow writes, never in argv (the submit command is
    # in the log), XCom or the Asset event
    secret = s3_server.store.secret_access_key
    for run in (first, second):
        assert secret not in run.stdout + run.stderr
    assert secret not in json.dumps(result) + json.dumps(snapshot) + json.dumps(upkeep)
    # lineage: the published table in, the lake's tables out, in the bucket's namespace
    source = (f"postgres://{publisher.host}:{publisher.port}", f"{db}.public.orders")
    table = f"{prefix}/%s/public.orders"
    assert completed(events, "initial_snapshot") == (
        [source], [(f"s3://{bucket}", table % "state")]
    )  # fmt: skip
    inputs, outputs = completed(events, "drain")
    assert inputs == [source]
    assert outputs == [(f"s3://{bucket}", table % k) for k in ("changes", "state")]
    assert secret not in events.read_text()
