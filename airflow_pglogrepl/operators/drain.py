"""``SlotDrainOperator``: run the drain application with spark-submit, gated by a slot check.

The Spark provider's hook runs ``spark-submit`` (master and deploy mode from the Spark
connection). Around it this operator checks the slot before anything starts, hands the source
DSN to the application through its environment only, ships this package to the executors, reads
the run's JSON summary back, and pushes LSNs and counts to XCom with an Asset event for the sink.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, Context

from airflow_pglogrepl.operators._hooks import replication_hook

PACKAGE_DIR = Path(__file__).resolve().parent.parent
DRAIN_APP = str(PACKAGE_DIR / "spark" / "drain_app.py")
DSN_ENV = "PGLOGREPL_SOURCE_DSN"


def sink_asset(sink: str) -> Asset:
    """The Asset a sink is known by: its URI (``file://`` + absolute path for local paths)."""
    uri = sink if "://" in sink else f"file://{os.path.abspath(sink)}"
    return Asset(uri=uri)


class _CapturingSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook that also keeps the application's output lines (for its JSON summary)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.captured: list[str] = []

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        def tee() -> Iterator[Any]:
            for line in itr:
                self.captured.append(str(line).strip())
                yield line

        super()._process_spark_submit_log(tee())


class SlotDrainOperator(SparkSubmitOperator):
    """Drain a logical slot into a Parquet lake, exactly once, in bounded LSN windows.

    Before submitting, the slot must exist, use ``pgoutput``, not be lost and not be active in
    another session; otherwise the task fails with that reason and Spark never starts. The
    publisher's DSN reaches the application only through ``PGLOGREPL_SOURCE_DSN`` in the
    spark-submit process environment (never argv, XCom or the log). After the job the slot is read
    again; XCom gets the summary (return value) and ``confirmed_flush_lsn``; the sink is emitted
    as an Asset event.

    :param postgres_conn_id: the publisher's Airflow connection (database of the slot).
    :param slot_name: the logical slot to drain (plugin ``pgoutput``).
    :param publications: publications whose tables are drained.
    :param sink: lake root (path or URI Spark can write).
    :param max_window_bytes: WAL bytes per window.
    :param max_windows: stop after this many windows (default: up to the WAL at start).
    :param materialize: merge committed changes into ``state/``.
    :param database: the slot's database, when not the connection's.
    :param conn_id: the Spark connection; it must exist (the provider would otherwise silently
        submit to YARN).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "postgres_conn_id", "slot_name", "publications", "sink", "database",
        "max_window_bytes", "max_windows",
    )  # fmt: skip
    ui_color = "#fdebd0"

    def __init__(
        self,
        *,
        postgres_conn_id: str,
        slot_name: str,
        publications: Sequence[str],
        sink: str,
        max_window_bytes: int = 64 * 1024 * 1024,
        max_windows: int | None = None,
        materialize: bool = True,
        database: str | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "pglogrepl-drain")
        kwargs.setdefault("outlets", [sink_asset(sink)] if "{{" not in sink else [])
        super().__init__(application=DRAIN_APP, conn_id=conn_id, **kwargs)
        self.postgres_conn_id = postgres_conn_id
        self.slot_name = slot_name
        self.publications = publications
        self.sink = sink
        self.max_window_bytes = max_window_bytes
        self.max_windows = max_windows
        self.materialize = materialize
        self.database = database

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_pglogrepl.conninfo import make_dsn
        from airflow_pglogrepl.exceptions import PgLogReplError, SlotInUseError

        hook = replication_hook(self.postgres_conn_id, self.database)
        slot = hook.get_slot(self.slot_name, plugin="pgoutput")
        if slot.wal_status == "lost":
            raise AirflowFailException(
                f"replication slot {self.slot_name!r} is lost (wal_status = lost); nothing can be "
                f"drained from it. Fix: drop it and start over from a new initial snapshot"
            )
        if slot.active:
            raise SlotInUseError(self.slot_name, slot.active_pid)
        self._check_spark_connection()
        dsn = make_dsn(hook.connection_params())
        _mask(dsn)
        self.env_vars = {
            **(self.env_vars or {}),
            DSN_ENV: dsn,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            **_spark_home_env(),
        }
        self.application_args = self._app_args()
        if self._spark_binary is None:
            self._spark_binary = _spark_submit_binary()
        with tempfile.TemporaryDirectory(prefix="pglogrepl-pyfiles-") as tmp:
            self.py_files = _package_zip(Path(tmp))
            super().execute(context)
        hook_output = getattr(self._hook, "captured", [])
        summary = _summary(hook_output)
        if summary is None:
            raise PgLogReplError(
                "the drain application finished without its JSON summary line; see the log above"
            )
        after = hook.get_slot(self.slot_name)
        result = {
            **summary,
            "confirmed_flush_lsn_before": str(slot.confirmed_flush_lsn),
            "confirmed_flush_lsn_after": str(after.confirmed_flush_lsn),
            "sink": self.sink,
        }
        context["ti"].xcom_push(key="confirmed_flush_lsn", value=str(after.confirmed_flush_lsn))
        for asset in self.outlets or []:
            context["outlet_events"][asset].extra = {
                "slot": self.slot_name,
                "confirmed_flush_lsn": str(after.confirmed_flush_lsn),
                "changes": summary.get("changes", 0),
            }
        self.log.info(
            "Drained slot %s: %s windows, %s transactions, %s changes; confirmed %s -> %s",
            self.slot_name, summary.get("windows"), summary.get("transactions"),
            summary.get("changes"), slot.confirmed_flush_lsn, after.confirmed_flush_lsn,
        )  # fmt: skip
        return result

    def _get_hook(self) -> SparkSubmitHook:
        base = super()._get_hook()
        hook = _CapturingSparkSubmitHook.__new__(_CapturingSparkSubmitHook)
        hook.__dict__.update(base.__dict__)
        hook.captured = []
        return hook

    def _app_args(self) -> list[str]:
        args = ["--slot", str(self.slot_name), "--sink", str(self.sink)]
        args += ["--max-window-bytes", str(int(self.max_window_bytes))]
        args += ["--publication", *[str(p) for p in self.publications]]
        if str(self.max_windows) not in ("None", ""):  # templated: may render as text
            args += ["--max-windows", str(int(str(self.max_windows)))]
        if not self.materialize:
            args.append("--no-materialize")
        return args

    def _check_spark_connection(self) -> None:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowFailException

        try:
            conn = BaseHook.get_connection(self._conn_id)
        except Exception:
            raise AirflowFailException(
                f"Spark connection {self._conn_id!r} is not defined; without it the Spark "
                f"provider silently submits to YARN. Fix: define it, for local Spark e.g. "
                f'AIRFLOW_CONN_{self._conn_id.upper()}=\'{{"conn_type": "spark", '
                f'"host": "local[*]"}}\', or a spark://host:7077 master'
            ) from None
        master = f"{conn.conn_type}://{conn.host or ''}"
        if "yarn" in master or "k8s" in master or conn.extra_dejson.get("deploy-mode") == "cluster":
            raise AirflowFailException(
                f"Spark connection {self._conn_id!r} ({master}) would pass the source DSN on the "
                f"spark-submit command line (YARN/Kubernetes/cluster mode turn environment "
                f"variables into --conf arguments). Use a local or standalone master in client "
                f"mode"
            )


def _summary(lines: Sequence[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "windows" in value:
                return value
    return None


def _mask(secret: str) -> None:
    from airflow.sdk.log import mask_secret

    mask_secret(secret)


def _spark_submit_binary() -> str:
    """``spark-submit`` from PATH, else the one pyspark installed next to this interpreter."""
    found = shutil.which("spark-submit")
    if found:
        return found
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    raise FileNotFoundError(
        "spark-submit is neither on PATH nor next to this Python; install the full 'pyspark' "
        "package (the Spark provider's pyspark-client has no spark-submit) or pass spark_binary"
    )


def _spark_home_env() -> dict[str, str]:
    if os.environ.get("SPARK_HOME"):
        return {}
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return {}
    return {"SPARK_HOME": str(Path(spec.origin).parent)}


def _package_zip(directory: Path) -> str:
    """This package as a zip for ``--py-files``: executors get the code without installing it."""
    target = directory / "airflow_pglogrepl.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in PACKAGE_DIR.rglob("*.py"):
            archive.write(path, path.relative_to(PACKAGE_DIR.parent))
    return str(target)
