"""Runs of ``SlotDrainOperator`` on one source and lake, with a stand-in spark-submit that counts
its calls and runs the drain application with this Python (a local lake needs no JVM to drain or
to merge small batches), so a test sees exactly which runs were submitted."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.operators.drain import SlotDrainOperator
from tests.support.airflow import FakeTI, set_airflow_connection
from tests.support.paths import REPO
from tests.support.sources import Source

FAKE_SPARK_SUBMIT = """#!{python}
import os, subprocess, sys
with open({calls!r}, "a") as calls:
    calls.write(" ".join(sys.argv[1:]) + "\\n")
app = next(i for i, a in enumerate(sys.argv) if a.endswith("drain_app.py"))
env = {{**os.environ, "PYTHONPATH": {repo!r}}}
sys.exit(subprocess.run([sys.executable, *sys.argv[app:]], env=env).returncode)
"""


class OutletEvents:
    """An outlet's events as a task sees them: an Asset's ``extra``, an alias's ``add``."""

    def __init__(self) -> None:
        self.extra: Any = None
        self.added: list[tuple[Any, Any]] = []

    def add(self, asset: Any, extra: Any = None) -> None:
        self.added.append((asset, extra))


class Drains:
    """Runs of the operator on one source and lake, and the spark-submit calls they made."""

    def __init__(self, src: Source, tmp_path: Path) -> None:
        self.src = src
        self.lake_root = str(tmp_path / "lake")
        self.calls = tmp_path / "spark-submit-calls"
        self.calls.touch()
        self.binary = tmp_path / "spark-submit"
        self.binary.write_text(
            FAKE_SPARK_SUBMIT.format(python=sys.executable, calls=str(self.calls), repo=str(REPO))
        )
        self.binary.chmod(0o755)
        self.conn_id = f"drain_op_{src.db}"
        set_airflow_connection(self.conn_id, src.cluster.airflow_uri(src.db))
        set_airflow_connection(
            "drain_op_spark", json.dumps({"conn_type": "spark", "host": "local[1]"})
        )

    def submits(self) -> int:
        return len(self.calls.read_text().splitlines())

    def confirmed(self) -> str:
        rows = self.src.sql(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (self.src.slot,),
        )
        return str(rows[0][0])

    def flush(self) -> LSN:
        return LSN(str(self.src.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0]))

    def run(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """One run: its return value, and what it pushed (XCom) and emitted (Asset extra)."""
        kwargs.setdefault("spark_binary", str(self.binary))  # None: no spark-submit asked for
        task = SlotDrainOperator(
            task_id="drain", postgres_conn_id=self.conn_id, slot_name=self.src.slot,
            publications=[self.src.publication], lake=self.lake_root, conn_id="drain_op_spark",
            **kwargs,
        )  # fmt: skip
        ti = FakeTI()
        events: defaultdict[Any, OutletEvents] = defaultdict(OutletEvents)
        context: Any = {"ti": ti, "outlet_events": events}
        result = task.execute(context)
        extras = [event.extra for event in events.values() if event.extra is not None]
        tables = {asset.uri: extra for event in events.values() for asset, extra in event.added}
        return result, {**ti.pushed, "asset": extras, "table_assets": tables}
