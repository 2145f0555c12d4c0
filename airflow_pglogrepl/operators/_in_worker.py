"""The drain and snapshot applications run as plain Python processes on the worker, for a local
Spark master.

spark-submit starts a JVM before the application's first line, 3 to 10 seconds on a small
machine, and these applications may never need it: the drain's changelog is written by pyarrow
and delta-rs, and most small batches merge without a JVM; a snapshot of small tables is copied
in the application's own process. With a local master (``local``,
``local[N]``, ``local[*]``) everything runs on the worker anyway, so the operator runs the
application with this Python instead (``python -m``), and the application starts its local
Spark session only when a table needs it, with the same master and configuration spark-submit
would have had (``SPARK_SETTINGS_ENV``). Output, summary line, quiet filter and kill behave as
under spark-submit. A cluster master, or an explicit ``spark_binary``, keeps spark-submit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_pglogrepl.spark.session import SPARK_SETTINGS_ENV

__all__ = ["SPARK_SETTINGS_ENV", "WorkerRun", "local_master", "spark_settings"]


def local_master(master: str | None) -> bool:
    """Whether ``master`` runs everything in one JVM on this machine."""
    value = (master or "").strip()
    return value == "local" or value.startswith("local[")


@dataclass
class WorkerRun:
    """One run of an application module in a child process of the worker: its lines (kept for
    the summary), its exit status, and the process while it runs (for ``kill``)."""

    module: str
    args: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    captured: list[str] = field(default_factory=list)
    process: subprocess.Popen[str] | None = None

    def run(self, show: Callable[[str], None]) -> int:
        """Run to the end; ``show`` gets each output line the task log should have."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            env=dict(self.env), cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        for line in self.process.stdout:
            text = line.rstrip("\n")
            self.captured.append(text.strip())
            show(text)
        return self.process.wait()

    def kill(self) -> None:
        """End the application and the Spark JVM it started (its own process group)."""
        process = self.process
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            logging.getLogger(__name__).info("application process %s killed", process.pid)


def spark_settings(master: str, conf: Mapping[str, Any], *, app_name: str,
                   driver_memory: str | None) -> str:  # fmt: skip
    """``SPARK_SETTINGS_ENV``'s value: the session spark-submit would have built."""
    settings = {str(k): str(v) for k, v in conf.items()}
    settings["spark.app.name"] = app_name
    if driver_memory:
        settings["spark.driver.memory"] = str(driver_memory)
    return json.dumps({"master": master, "conf": settings})
