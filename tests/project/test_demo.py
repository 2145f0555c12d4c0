"""``make demo``'s script end to end: its own clusters, Airflow home and Spark; summary checked."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.paths import REPO

# The demo runs Airflow's dags test and Spark in a process of its own.
pytestmark = [pytest.mark.spark, pytest.mark.airflow]


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_demo_runs_and_reports(tmp_path: Path, pg_tool: Callable[[str], Path], where: str) -> None:
    pg_tool("pgbench")  # the demo's write load
    summary_file = tmp_path / "summary.json"
    s3 = ["--s3"] if where == "s3" else []
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--summary", str(summary_file), *s3],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    summary = json.loads(summary_file.read_text())
    assert "what happened" in result.stdout
    cutover = summary["cutover"]
    assert cutover["state"] == "success"
    assert cutover["tasks"]["parity_check"]["result"]["passed"] is True
    assert cutover["tasks"]["write_fence"]["result"]["fence_lsn"]
    assert cutover["tasks"]["release_fence"]["state"] == "skipped"
    drain = summary["drain"]
    assert drain["state"] == "success"
    assert summary["snapshot"]["tasks"]["initial_snapshot"]["result"]["committed"] is True
    assert drain["tasks"]["initial_snapshot"]["result"]["status"] == "exists"
    assert drain["tasks"]["drain"]["result"]["changes"] > 0
    assert drain["tasks"]["upkeep"]["state"] == "success"  # the lake's upkeep ran after the drain
    assert drain["tasks"]["upkeep"]["result"]["tables"]
    # the lake holds exactly the old primary's rows, table by table
    assert summary["lake_rows"] == summary["source_rows"]  # read through deltalake, no JVM
    assert summary["lake_rows_spark_sql"] == summary["source_rows"]  # and through Spark SQL
    assert summary["source_rows"]["public.pgbench_accounts"] == 100_000
    if where == "s3":  # the lake is in the bucket, read back from there
        assert summary["lake"].startswith("s3://lake-") and summary["lake"].endswith("/lakes/shop")
        assert summary["lake_objects"] > 20
    # the demo cleaned up after itself: clusters stopped, work directory gone
    assert not Path(summary["work_dir"]).exists()
