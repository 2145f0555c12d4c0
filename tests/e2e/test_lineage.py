"""The subscription's OpenLineage events and metrics in a real ``airflow dags test`` run: the
publisher's published tables in, the subscriber's tables of the same names out, and the ready
sensor's gauges as a StatsD server receives them (the snapshot's and the drain's are read in
tests/e2e/test_pglogrepl_incremental_drain.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl.testing.pgcluster import PgCluster
from tests.e2e.test_pglogrepl_incremental_drain import StatsdListener, completed, lineage_env
from tests.e2e.test_pglogrepl_setup import Flow, _flow, _orders


@pytest.fixture
def flow(publisher: PgCluster, subscriber: PgCluster, airflow_home: object) -> Iterator[Flow]:
    yield from _flow(publisher, subscriber)


def test_a_subscriptions_lineage_and_metrics_name_both_sides(flow: Flow, tmp_path: Path) -> None:
    _orders(flow, 1000)
    events = tmp_path / "lineage.jsonl"
    conf = flow.params(tables=["orders", "customers"])
    statsd = StatsdListener()
    try:
        run = subprocess.run(
            [sys.executable, "-m", "airflow", "dags", "test", "pglogrepl_setup", "-c",
             json.dumps(conf)],
            capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, **lineage_env(events), **statsd.env()},
        )  # fmt: skip
    finally:
        statsd.close()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # the ready sensor's gauges (docs/reference/metrics.md): the last poke saw every table ready
    metric = "airflow.pglogrepl.subscription.flow_sub."
    assert statsd.values(metric + "tables_not_ready")[-1] == (0.0, "g")
    assert statsd.values(metric + "apply_errors")[-1] == (0.0, "g")
    publisher = f"postgres://{flow.publisher.host}:{flow.publisher.port}"
    subscriber = f"postgres://{flow.subscriber.host}:{flow.subscriber.port}"
    inputs, outputs = completed(events, "create_subscription")
    assert inputs == [(publisher, f"{flow.pub_db}.public.{t}") for t in ("customers", "orders")]
    assert outputs == [(subscriber, f"{flow.sub_db}.public.{t}") for t in ("customers", "orders")]
    found = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    done = [e for e in found if e["eventType"] == "COMPLETE"
            and e["job"]["name"].endswith(".create_subscription")]  # fmt: skip
    orders = next(d for d in done[-1]["outputs"] if d["name"].endswith(".orders"))
    fields = [(f["name"], f["type"]) for f in orders["facets"]["schema"]["fields"]]
    assert fields == [("id", "bigint"), ("customer", "text"), ("amount", "numeric")]
    assert flow.publisher.password not in events.read_text()
