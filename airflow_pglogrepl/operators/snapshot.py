"""``InitialSnapshotOperator``: the lake's consistent starting point, copied by Spark.

The operator creates the drain's slot with an exported snapshot over a replication session and
keeps that session open, idle, while spark-submit runs the snapshot application, whose tasks
import the snapshot and copy the published tables in parallel. The application commits the copy
in the lake at the slot's consistent point, so the drain continues at the slot's first change.
If the job fails before that commit, the operator drops the slot it created and the lake keeps
no partial ``state/``; if the job died after it, the snapshot stands and the operator finishes it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import AssetAlias, Context

from airflow_pglogrepl import metrics
from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.operators.assets import snapshot_events
from airflow_pglogrepl.operators.spark_submit import (
    PACKAGE_DIR,
    PackageSparkSubmitOperator,
    state_vectors_args,
)
from airflow_pglogrepl.operators.task_reports import snapshot_paragraph
from airflow_pglogrepl.spark.snapshot_engine import SPARK_ABOVE_BYTES, check_engine

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from airflow_pglogrepl.postgres.snapshot import ExportedSnapshot


SNAPSHOT_APP = str(PACKAGE_DIR / "spark" / "snapshot_app.py")


class InitialSnapshotOperator(PackageSparkSubmitOperator):
    """Take the initial snapshot of a publication into a lake, at a new slot's start.

    Creates ``slot_name`` (plugin ``pgoutput``) with an exported snapshot, holds the exporting
    session during the Spark job, and has the snapshot application copy every published table
    into ``<lake>/state/`` and commit it at the slot's consistent point (XCom
    ``consistent_point``; the return value is the application's summary). The lake must hold no
    commit yet. Running it again after success changes nothing (status ``exists``);
    ``bootstrap=True`` also leaves a lake drained without a snapshot alone (status ``drained``).
    Every publication must exist first: a missing one fails the task before anything starts,
    naming those that exist and the closest.

    With ``tables``, only those tables are re-snapshotted into a lake that already has commits
    (a table added to the publication later), in a temporary slot's snapshot: the drain's slot
    and the other tables are not touched. Run it while no drain of this lake runs.

    :param postgres_conn_id: the publisher's Airflow connection (database of the slot).
    :param slot_name: the drain's logical slot, created here.
    :param publications: publications whose tables are copied.
    :param lake: lake root (path or URI Spark can write).
    :param tables: re-snapshot only these tables (``schema.table``).
    :param tasks_per_table: at most this many ranges (Spark tasks) per table; default Spark's
        default parallelism.
    :param rows_per_task: about this many rows per range.
    :param parallelism: tables copied at the same time.
    :param engine: what copies the tables: ``"process"`` (the application's own process, no
        Spark), ``"spark"`` (Spark tasks), or ``"auto"``: in process for a table whose heap is
        at most ``spark_above_mib``, on Spark for a bigger one. A snapshot of small tables then
        starts no Spark at all (on a local master, no JVM).
    :param spark_above_mib: with ``engine="auto"``, the heap size (MiB) above which a table is
        copied on Spark.
    :param lock_timeout: seconds the snapshot waits, in all, for ``ACCESS SHARE`` on the tables
        it copies (it holds them until the copy is done, so no table rewrite can land in the
        middle); a reader waits at most as long behind a statement it could not cancel.
    :param replace_slot: when the slot already exists and the lake holds no commit at all (a
        slot left by a killed run, or created for a drain that never ran), drop and re-create
        it; never done when the lake holds commits.
    :param bootstrap: the first task of a drain DAG: succeed without doing anything when the
        lake already holds commits of an existing slot (its snapshot, or windows drained without
        one), take the snapshot otherwise. An existing slot with a lake that holds nothing is
        replaced only when the lake holds the uncommitted snapshot a killed run took at the
        slot's position; otherwise the task fails, since an empty-looking path may be an
        unmounted volume or a changed lake (``replace_slot=True`` is the explicit signal).
    :param failover: create the slot as a failover slot, synchronized to standbys so a
        promotion keeps it (docs/high-availability.md). Default: wherever the server can (a
        primary of PostgreSQL 17 or later); ``True`` fails on a server that cannot.
    :param state_deletion_vectors: whether the lake creates its state tables with deletion
        vectors (cheap Spark merges) or without (readers that cannot apply them, such as
        ``deltalake``'s ``to_pandas()``, read them). None: as the lake records it, on for a new
        lake. Recorded in the lake, so the drain's merges create later tables the same way; a
        re-snapshotted table keeps its own setting (docs/drain.md, "Reading the lake").
    :param database: the slot's database, when not the connection's.
    :param conn_id: the Spark connection; it must exist.
    :param spark_log_level: Spark's own logging in the task log (``WARN``; ``INFO`` or
        ``DEBUG`` to see what Spark did).
    """

    # A local master runs the application without spark-submit (``operators._in_worker``): a
    # snapshot of small tables copies them in its own process and never needs the JVM that
    # spark-submit would start first.
    IN_WORKER_MODULE = "airflow_pglogrepl.spark.snapshot_app"

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "postgres_conn_id", "slot_name", "publications", "lake", "tables", "database",
        "tasks_per_table", "rows_per_task", "spark_log_level", "lake_conn_id", "engine",
    )  # fmt: skip
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        postgres_conn_id: str,
        slot_name: str,
        publications: Sequence[str],
        lake: str,
        tables: Sequence[str] | None = None,
        tasks_per_table: int | None = None,
        rows_per_task: int = 1_000_000,
        parallelism: int = 4,
        engine: str = "auto",
        spark_above_mib: int = SPARK_ABOVE_BYTES >> 20,
        lock_timeout: float = 60.0,
        replace_slot: bool = False,
        bootstrap: bool = False,
        failover: bool | None = None,
        database: str | None = None,
        conn_id: str = "spark_default",
        state_deletion_vectors: bool | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "pglogrepl-snapshot")
        super().__init__(application=SNAPSHOT_APP, conn_id=conn_id,
                         postgres_conn_id=postgres_conn_id, slot_name=slot_name,
                         publications=publications, lake=lake, **kwargs)  # fmt: skip
        self.tables = tables
        self.tasks_per_table = tasks_per_table
        self.rows_per_task = rows_per_task
        self.parallelism = parallelism
        self.engine = engine
        self.spark_above_mib = spark_above_mib
        self.lock_timeout = lock_timeout
        self.replace_slot = replace_slot
        self.bootstrap = bootstrap
        self.failover = failover
        self.database = database
        self.state_deletion_vectors = state_deletion_vectors
        self._exported: ExportedSnapshot | None = None

    # -- execution ----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        from airflow_pglogrepl.conninfo import make_dsn

        self._engine_args()  # before anything starts: a wrong value must not leave a slot behind
        hook = self._source_hook()
        # before the lake is looked at: a misspelt publication is not a snapshot already taken
        hook.require_publications(
            [str(p) for p in self.publications], slot=str(self.slot_name),
            consequence="Nothing was started: no slot was created or dropped, the lake was not "
            "read or written, and spark-submit did not run",
        )  # fmt: skip
        hook.require_slot_privileges(reads=[str(p) for p in self.publications])
        self._check_spark_connection()
        self._use_lake_store(str(self.lake))
        self._prepare_submit(make_dsn(hook.connection_params()))
        with self._shipping_package():
            if self._table_list():
                result = self._resnapshot(context, hook)
            else:
                result = self._initial(context, hook)
        context["ti"].xcom_push(key="consistent_point", value=result["consistent_point"])
        outlet_events = context.get("outlet_events")
        for asset in self.outlets or []:
            if outlet_events is not None and isinstance(asset, AssetAlias):
                for table, extra in snapshot_events(result, str(self.lake)):  # each table copied
                    outlet_events[asset].add(table, extra=extra)
            elif outlet_events is not None:
                outlet_events[asset].extra = {
                    "slot": self.slot_name,
                    "consistent_point": result["consistent_point"],
                    "rows": result.get("rows", 0),
                }
        if result.get("committed"):
            metrics.snapshot(str(self.slot_name), result)
        self.log.info("%s", snapshot_paragraph(result, lake_root=str(self.lake)))
        return result

    def _initial(self, context: Context, hook: PgLogicalReplicationHook) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import SlotNotFoundError, SnapshotNotCommittedError
        from airflow_pglogrepl.lake.snapshots import bootstrap_plan

        slot_lsn: str | None = None
        try:
            found = hook.get_slot(self.slot_name)
            exists = True
            slot_lsn = str(found.confirmed_flush_lsn) if found.confirmed_flush_lsn else None
        except SlotNotFoundError:
            exists = False
        # a refusal is a LakeMismatchError: a person must decide, the boundary fails the task
        # at once
        plan = bootstrap_plan(
            slot=str(self.slot_name), slot_exists=exists, status=self._lake_status(),
            lake=str(self.lake), replace_slot=self.replace_slot, bootstrap=self.bootstrap,
            slot_lsn=slot_lsn,
        )  # fmt: skip
        if plan.action == "exists":
            return self._unchanged("exists", plan.snapshot_lsn)
        if plan.action == "drained":
            return self._unchanged("drained", None)
        if plan.action == "replace_slot":
            self.log.warning(
                "Dropping slot %s (%s) to re-create it with an exported snapshot",
                self.slot_name,
                "replace_slot=True"
                if self.replace_slot
                else "the lake holds the uncommitted snapshot a killed run took at its position",
            )
            hook.drop_slot(self.slot_name)
        exported = hook.create_slot_with_snapshot(self.slot_name, failover=self.failover)
        self._exported = exported
        point = str(exported.consistent_point)
        args = self._copy_args(exported)
        try:
            summary = self._submit(context, args)
            if not summary or not summary.get("committed"):
                raise SnapshotNotCommittedError(
                    "the snapshot application finished without committing; see the log above"
                )
        except BaseException as exc:
            # Only now may the session end: the job (and every task that imported the
            # snapshot) is over, whether it failed or was killed.
            exported.close()
            self._exported = None
            if self._settle(context, point) and isinstance(exc, Exception):
                self.log.warning(
                    "The snapshot job failed after its commit at %s: the snapshot stands and "
                    "the lake was finished; slot %s is kept", point, self.slot_name,
                )  # fmt: skip
                return {"status": "committed", "committed": True, "mode": "initial",
                        "slot": self.slot_name, "consistent_point": point, "recovered": True,
                        "lake": self.lake}  # fmt: skip
            raise
        finally:
            exported.close()
            self._exported = None
        return {**summary, "lake": self.lake}

    def _unchanged(self, status: str, point: str | None) -> dict[str, Any]:
        return {"status": status, "committed": status == "exists", "mode": "initial",
                "slot": self.slot_name, "consistent_point": point, "rows": 0,
                "lake": self.lake}  # fmt: skip

    def _resnapshot(self, context: Context, hook: PgLogicalReplicationHook) -> dict[str, Any]:
        from airflow_pglogrepl.exceptions import SnapshotNotCommittedError
        from airflow_pglogrepl.lake.snapshots import temporary_slot_name

        hook.get_slot(self.slot_name, plugin="pgoutput")  # the drain's slot must exist
        with hook.create_slot_with_snapshot(
            temporary_slot_name(self.slot_name), temporary=True
        ) as exported:
            args = self._copy_args(exported)
            args += [item for table in self._table_list() for item in ("--table", table)]
            summary = self._submit(context, args)
        if not summary or not summary.get("committed"):
            raise SnapshotNotCommittedError(
                "the re-snapshot finished without committing; see the log above"
            )
        return {**summary, "lake": self.lake}

    def _settle(self, context: Context, point: str) -> bool:
        """After a failed job: finish a committed snapshot (True) or undo it: drop the slot and
        the staged files (False)."""
        try:
            committed = bool(self._lake_status(point).get("committed"))
        except Exception:
            # Cannot tell: keep the slot (dropping it under a committed snapshot would lose the
            # hand-off); the next run's checks decide.
            self.log.exception("could not read lake %s after the failure", self.lake)
            return False
        if not committed:
            hook = self._source_hook()
            dropped = hook.drop_slot(self.slot_name, missing_ok=True)
            self.log.warning(
                "Snapshot not committed: slot %s %s; nothing of it is left in %s",
                self.slot_name, "dropped" if dropped else "was already gone", self.lake,
            )  # fmt: skip
        return committed

    def on_kill(self) -> None:
        super().on_kill()
        exported = self._exported
        if exported is not None:
            exported.close()

    # -- spark-submit -------------------------------------------------------------------------

    def _copy_args(self, exported: ExportedSnapshot) -> list[str]:
        args = ["--slot", str(self.slot_name), "--lake", str(self.lake)]
        args += ["--publication", *[str(p) for p in self.publications]]
        args += ["--snapshot-name", exported.snapshot_name]
        args += ["--consistent-point", str(exported.consistent_point)]
        args += ["--rows-per-task", str(int(str(self.rows_per_task)))]
        args += ["--parallelism", str(int(self.parallelism))]
        args += ["--lock-timeout", str(float(self.lock_timeout))]
        args += self._engine_args()
        if str(self.tasks_per_table) not in ("None", ""):  # templated: may render as text
            args += ["--tasks-per-table", str(int(str(self.tasks_per_table)))]
        return args + state_vectors_args(self.state_deletion_vectors)

    def _engine_args(self) -> list[str]:
        """``engine`` and ``spark_above_mib`` as the application's arguments, checked."""
        above = int(str(self.spark_above_mib))  # templated: may render as text
        if above < 0:
            raise ValueError(f"spark_above_mib must be 0 or more, not {above}")
        return ["--engine", check_engine(str(self.engine)), "--spark-above-mib", str(above)]

    def _submit(self, context: Context, args: list[str]) -> dict[str, Any] | None:
        """Run the application with ``args``; its JSON summary, or None when it printed none."""
        self.application_args = args
        self._hook = None  # the hook takes the arguments when built
        self._run_application(context)
        return self._summary("committed", "resolved")

    def _lake_status(self, point: str | None = None) -> dict[str, Any]:
        """``lake.snapshots.resolve`` on the lake, read in this process through ``deltalake``
        (no JVM; the lake is only read: operators never modify it)."""
        from airflow_pglogrepl.lake.lake import Lake
        from airflow_pglogrepl.lake.snapshots import resolve
        from airflow_pglogrepl.lsn import LSN

        return resolve(Lake(str(self.lake), str(self.slot_name)), LSN(point) if point else None)

    # -- helpers ------------------------------------------------------------------------------

    def _table_list(self) -> list[str]:
        tables = self.tables
        if tables is None or str(tables) in ("None", "", "[]"):
            return []
        if isinstance(tables, str):  # templated: may render as text
            tables = json.loads(tables) if tables.startswith("[") else [tables]
        return [str(t) for t in tables]

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (``operators.lineage``): the published tables in, the lake's
        ``state/`` tables out."""
        from airflow_pglogrepl.operators.lineage import lake_lineage

        return lake_lineage(self._source_hook(), self.publications, str(self.lake),
                            kinds=("state",), only=self._table_list() or None)  # fmt: skip

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """OpenLineage of a failed snapshot: the tables it read, no output claimed."""
        from airflow_pglogrepl.operators.lineage import lake_lineage

        return lake_lineage(self._source_hook(), self.publications, str(self.lake), kinds=(),
                            only=self._table_list() or None)  # fmt: skip

    def _source_hook(self) -> PgLogicalReplicationHook:
        """The publisher (the hook carries the snapshot statements)."""
        return replication_hook(self.postgres_conn_id, self.database)
