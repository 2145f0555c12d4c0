"""``SlotDrainOperator``: run the drain application with spark-submit, gated by a slot check.

The Spark provider's hook runs ``spark-submit`` (master and deploy mode from the Spark
connection). Around it this operator checks the slot before anything starts, hands the source
DSN to the application through its environment only, ships this package to the executors, reads
the run's JSON summary back, and pushes LSNs and counts to XCom with an Asset event for the lake.
A run with nothing to drain or merge is told apart on the worker first and submits nothing
(``skip_when_idle``, ``operators._idle``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import AssetAlias, Context

from airflow_pglogrepl import metrics
from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.operators.assets import table_events
from airflow_pglogrepl.operators.spark_submit import (
    PACKAGE_DIR,
    PackageSparkSubmitOperator,
    state_vectors_args,
)
from airflow_pglogrepl.operators.task_reports import drain_paragraph

if TYPE_CHECKING:
    from airflow_pglogrepl.pipeline.idle import Idle

__all__ = ["DRAIN_APP", "SlotDrainOperator"]

DRAIN_APP = str(PACKAGE_DIR / "spark" / "drain_app.py")
ON_QUARANTINE = ("fail", "warn")
ON_INCOMPLETE = ("backfill", "resnapshot", "report")
READERS = ("auto", "stream", "peek")  # pipeline.results.READERS, without importing the pipeline


class SlotDrainOperator(PackageSparkSubmitOperator):
    """Drain a logical slot into a Delta Lake lake, exactly once, in bounded LSN windows.

    Before submitting, the slot must exist, use ``pgoutput``, not be lost and not be active in
    another session, and every publication must exist in its database (a missing one is named,
    with those that exist and the closest); otherwise the task fails with that reason and Spark
    never starts. The
    publisher's DSN reaches the application only through ``PGLOGREPL_SOURCE_DSN`` in the
    spark-submit process environment (never argv, XCom or the log). After the job the slot is read
    again; XCom gets the summary (return value) and ``confirmed_flush_lsn``; the lake is emitted
    as an Asset event.

    :param postgres_conn_id: the publisher's Airflow connection (database of the slot).
    :param slot_name: the logical slot to drain (plugin ``pgoutput``).
    :param publications: publications whose tables are drained.
    :param lake: lake root: a path, or ``s3://bucket/prefix`` on S3 or an S3-compatible store
        (``lake_conn_id``; docs/object-storage.md).
    :param max_window_bytes: WAL bytes per window.
    :param max_windows: stop after this many windows (default: up to the WAL at start).
    :param materialize: merge committed changes into ``state/``.
    :param history: keep ``history/<table>`` beside ``state/``: every version of each row with
        its validity interval (SCD type 2; docs/history.md). ``True`` for every table, or a
        list of ``schema.table`` names (one string of names split by commas when templated).
    :param history_spark_bytes: a history whose files pass this many bytes ends its versions
        by a Spark MERGE, in deletion vectors, instead of delta-rs' rewrite of the files
        holding them (None: 256 MiB; 0: always on Spark). Spark starts only for such a batch.
    :param small_merge_rows: a table's batch of at most this many changes is merged without a
        JVM when it can be (keyed, no TRUNCATE or key change: ``merge.arrow``); 0 merges
        every table with Spark. A run whose batches are all merged so starts no Spark at all.
    :param merge_stall_seconds: a table's Spark merge that makes no progress for this long (a
        job running, no task of the application active, none finishing: a driver short of
        heap) is cancelled before it commits, and the task fails with ``MergeStalledError``
        (retryable) instead of hanging with the lake's writer lock. 0 or None: never.
    :param accept_source_change: drain although the lake was written from another system
        identifier or timeline (``LakeFromAnotherSourceError``). For one run, after checking
        that the change was deliberate: a ``pg_upgrade`` (new system identifier, slots carried
        over from 17). A promotion of the lake's own server needs no such run: its timeline
        history shows it (docs/high-availability.md). The new source is recorded from then on.
    :param skip_when_idle: before submitting, decide on the worker whether the run has anything
        to do, and when it has not, start no spark-submit: the task logs why and returns the
        summary of a run that drained and merged nothing (``idle`` True, ``spark_start_s``
        None). Idle means: the lake's position is the slot's ``confirmed_flush_lsn``, no change
        waits for its merge, the slot holds no published change, and at most ``idle_wal_bytes``
        of WAL from its ``restart_lsn`` (``operators._idle``). False: always submit.
    :param idle_wal_bytes: WAL the slot may hold (from its ``restart_lsn``) when a run is
        idle. Traffic outside the publications moves the WAL but not an idle slot; once more
        than this has accumulated, the run is submitted and the slot advances past it.
    :param state_deletion_vectors: whether the lake creates its state tables with deletion
        vectors (cheap Spark merges) or without (readers that cannot apply them, such as
        ``deltalake``'s ``to_pandas()``, read them; Spark's merges rewrite whole files). None:
        as the lake records it, on for a new lake. A value given is recorded in the lake, so
        every later run, snapshot and merge creates tables the same way; existing state tables
        keep their own setting (docs/drain.md, "Reading the lake").
    :param on_quarantine: what the task does when tables are in the lake's quarantine
        (``lake.quarantine``: a table whose changes the lake could not store goes there,
        every other table is drained and merged, the slot moves on): ``"fail"`` (the task
        fails naming each table, its error and the fix, every run until the tables are
        re-snapshotted) or ``"warn"`` (it logs that and succeeds; the summary's
        ``quarantined`` names them). The same holds for tables whose state the WAL could
        not keep equal to the source (a table added to the publication holding rows, a
        partition attached or detached: the summary's ``incomplete``; docs/drain.md).
    :param on_incomplete: what a run does with a table whose state the WAL could not keep
        equal to the source: ``"backfill"`` (default) copies it again in chunks while the
        drain goes on, over as many runs as it takes, and replaces its state whole when done
        (a table without a key is re-snapshotted instead; docs/drain.md, "Online backfill");
        ``"resnapshot"`` copies it whole in the run, before draining, at a temporary slot's
        consistent point (the role needs ``REPLICATION``); ``"report"`` only names it
        (``on_quarantine`` says whether the task fails).
    :param resync: tables to copy again while the drain goes on, their state replaced whole
        when done (rows the lake holds that the source has not are removed): the repair for
        a state damaged outside the product. Templated: ``"{{ params.resync }}"`` lets a
        manual trigger name them. A resync in progress goes on in the runs that follow.
    :param parity: tables whose state the run checks against the source at the same position
        (docs/drain.md, "The parity check"): copied in chunks while the drain goes on, like a
        backfill, then compared per bucket of keys; what differs is counted and its first
        keys named in the summary's ``parity`` (XCom), the log and the metrics, and the task
        fails with ``LakeDriftError`` (or warns, with ``on_quarantine="warn"``). Templated.
    :param parity_repair: a state the check finds different is replaced by what it read.
        Templated.
    :param backfill_chunk_rows: rows a backfill's chunk reads, about.
    :param accept_incomplete: differences from the source the lake stops reporting, each
        ``"schema.table"`` (any reason) or ``"schema.table:reason"`` (``added``,
        ``attached``, ``detached``, ``removed``). Given in the DAG it applies to every run:
        ``["public.events:detached"]`` keeps the rows of partitions dropped by retention as
        history, while a partition attached holding rows is still repaired or reported.
    :param reader: how the slot is read. ``"stream"``: the streaming replication protocol
        (``START_REPLICATION``), which decodes each WAL record once but pays the walsender's
        sending per message; the connection's role needs ``REPLICATION``. ``"peek"``:
        ``pg_logical_slot_peek_*``, which any role that may read the slot can use, and which
        decodes again from the slot's ``restart_lsn`` on every call. ``"auto"`` (default):
        peeks for a backlog, the stream when following or when ``restart_lsn`` is pinned so far
        behind that the peeks would decode more again than the stream costs (docs/drain.md,
        "Two ways to read the slot"); the summary's ``reader`` and ``reader_note`` say which,
        and why.
    :param follow: keep reading the slot instead of stopping at the WAL position found at the
        start: a window is committed every ``window_seconds`` while changes come (or every
        ``max_window_bytes`` of WAL), so rows are readable in ``changes/`` seconds after their
        commit. The run ends after ``follow_seconds`` (or ``max_windows``), or when the task
        is killed (SIGTERM: the window in hand is committed first); ``state/`` is merged at
        its end. Where the stream cannot be used, the peek drains in passes instead. The
        summary's ``follow`` says how long it ran, why it ended, and its freshness (p50, p99).
        ``skip_when_idle`` does not apply: a following run waits for changes.
    :param window_seconds: with ``follow``: seconds between window commits.
    :param follow_seconds: with ``follow``: end the run after this long (None: until killed).
    :param merge_seconds: with ``follow``: merge ``state/`` (and the histories kept) every this
        many seconds while following, so the current rows are that fresh too, not only when
        the run ends; the summary's ``follow.state_freshness`` says how fresh (p50, p99).
    :param database: the slot's database, when not the connection's.
    :param conn_id: the Spark connection; it must exist (the provider would otherwise silently
        submit to YARN).
    :param spark_log_level: Spark's own logging in the task log (``WARN``; ``INFO`` or
        ``DEBUG`` to see what Spark did). The drain's progress lines are logged whatever it is.

    The task log ends with a paragraph: changes, transactions and windows drained, the LSNs
    before and after, the busiest tables, the merge and what is left for the next run.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "postgres_conn_id", "slot_name", "publications", "lake", "database",
        "max_window_bytes", "max_windows", "small_merge_rows", "merge_stall_seconds",
        "idle_wal_bytes", "spark_log_level",
        "lake_conn_id", "reader", "window_seconds", "follow_seconds", "merge_seconds",
        "accept_incomplete",
        "resync", "parity", "parity_repair", "history", "history_spark_bytes",
    )  # fmt: skip
    ui_color = "#fdebd0"
    IN_WORKER_MODULE = "airflow_pglogrepl.spark.drain_app"

    def __init__(
        self,
        *,
        postgres_conn_id: str,
        slot_name: str,
        publications: Sequence[str],
        lake: str,
        max_window_bytes: int = 64 * 1024 * 1024,
        max_windows: int | None = None,
        materialize: bool = True,
        history: bool | Sequence[str] | str = False,
        history_spark_bytes: int | str | None = None,
        small_merge_rows: int = 100_000,
        merge_stall_seconds: float | None = 600.0,
        database: str | None = None,
        conn_id: str = "spark_default",
        accept_source_change: bool = False,
        skip_when_idle: bool = True,
        idle_wal_bytes: int = 16 * 1024 * 1024,
        state_deletion_vectors: bool | None = None,
        on_quarantine: str = "fail",
        reader: str = "auto",
        follow: bool = False,
        window_seconds: float = 5.0,
        follow_seconds: float | None = None,
        merge_seconds: float = 30.0,
        accept_incomplete: Sequence[str] = (),
        on_incomplete: str = "backfill",
        resync: Sequence[str] | str = (),
        parity: Sequence[str] | str = (),
        parity_repair: bool = False,
        backfill_chunk_rows: int = 1_000_000,
        **kwargs: Any,
    ) -> None:
        if on_quarantine not in ON_QUARANTINE:
            raise ValueError(f"on_quarantine must be one of {ON_QUARANTINE}, not {on_quarantine!r}")
        if on_incomplete not in ON_INCOMPLETE:
            raise ValueError(f"on_incomplete must be one of {ON_INCOMPLETE}, not {on_incomplete!r}")
        if "{" not in reader and reader not in READERS:  # a template is checked once rendered
            raise ValueError(f"reader must be one of {READERS}, not {reader!r}")
        kwargs.setdefault("name", "pglogrepl-drain")
        super().__init__(application=DRAIN_APP, conn_id=conn_id, postgres_conn_id=postgres_conn_id,
                         slot_name=slot_name, publications=publications, lake=lake,
                         **kwargs)  # fmt: skip
        self.max_window_bytes = max_window_bytes
        self.max_windows = max_windows
        self.materialize = materialize
        self.history = history
        self.history_spark_bytes = history_spark_bytes
        self.small_merge_rows = small_merge_rows
        self.merge_stall_seconds = merge_stall_seconds
        self.database = database
        self.accept_source_change = accept_source_change
        self.skip_when_idle = skip_when_idle
        self.idle_wal_bytes = idle_wal_bytes
        self.state_deletion_vectors = state_deletion_vectors
        self.on_quarantine = on_quarantine
        self.reader = reader
        self.follow = follow
        self.window_seconds = window_seconds
        self.follow_seconds = follow_seconds
        self.merge_seconds = merge_seconds
        self.accept_incomplete = accept_incomplete
        self.on_incomplete = on_incomplete
        self.resync = resync
        self.parity = parity
        self.parity_repair = parity_repair
        self.backfill_chunk_rows = backfill_chunk_rows
        if not follow and follow_seconds is not None:
            raise ValueError("follow_seconds bounds a following run: set follow=True as well")

    def _resync(self) -> list[str]:
        """The tables to resync, as rendered."""
        return _names(self.resync)

    def _history(self) -> list[str]:
        """The tables to keep history of, as rendered ('*': every table)."""
        given = self.history
        if isinstance(given, bool) or str(given).strip().lower() in ("true", "false", ""):
            return ["*"] if str(given).strip().lower() == "true" else []
        return _names(given)

    def _parity(self) -> list[str]:
        """The tables to check, as rendered."""
        return _names(self.parity)

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        from airflow_pglogrepl.conninfo import make_dsn
        from airflow_pglogrepl.exceptions import SnapshotNotCommittedError
        from airflow_pglogrepl.models.verdicts import drain_refusal

        hook = replication_hook(self.postgres_conn_id, self.database)
        slot = hook.get_slot(self.slot_name, plugin="pgoutput")
        refusal = drain_refusal(slot)
        if refusal is not None:  # lost: the boundary fails the task; in use: a retry may pass
            raise refusal
        hook.require_publications(
            [str(p) for p in self.publications], slot=str(self.slot_name),
            consequence="Nothing was started: spark-submit did not run and the slot did not move",
        )  # fmt: skip
        hook.require_slot_privileges()
        self._check_spark_connection()
        self._use_lake_store(str(self.lake))
        if (self.skip_when_idle and not self.accept_source_change and not self.follow
                and not self._resync() and not self._parity()):  # fmt: skip
            from airflow_pglogrepl.pipeline.idle import IdleCheck

            started = time.monotonic()
            idle = IdleCheck(hook, lake_root=str(self.lake), publications=self.publications,
                             materialize=self.materialize, history=self._history(),
                             max_wal_bytes=int(str(self.idle_wal_bytes))).run(slot)  # fmt: skip
            if idle is not None:
                metrics.slot(slot)
                return self._idle(context, idle, started)
        self._prepare_submit(make_dsn(hook.connection_params()))
        self.application_args = self._app_args()
        with self._shipping_package():
            self._run_application(context)
        summary = self._summary("windows")
        if summary is None:
            raise SnapshotNotCommittedError(
                "the drain application finished without its JSON summary line, so what it "
                "committed is unknown; see the log above. The slot was not advanced by this task"
            )
        after = hook.get_slot(self.slot_name)
        result = {
            **summary,
            "confirmed_flush_lsn_before": str(slot.confirmed_flush_lsn),
            "confirmed_flush_lsn_after": str(after.confirmed_flush_lsn),
            "lake": self.lake,
            "idle": False,
        }
        self._publish(context, str(after.confirmed_flush_lsn), summary.get("changes", 0),
                      idle=False, result=result)  # fmt: skip
        metrics.slot(after)
        metrics.drain(str(self.slot_name), result)
        self.log.info("%s", drain_paragraph(result, lake_root=str(self.lake)))
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (``operators.lineage``): the published tables in, the lake's
        ``changes/`` and ``state/`` tables out."""
        from airflow_pglogrepl.operators.lineage import lake_lineage

        hook = replication_hook(self.postgres_conn_id, self.database)
        kinds = ("changes", "state") if self.materialize else ("changes",)
        return lake_lineage(hook, self.publications, str(self.lake), kinds=kinds)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """OpenLineage of a failed run: the published tables in, no output claimed (the run
        may have committed some windows, or none)."""
        from airflow_pglogrepl.operators.lineage import lake_lineage

        hook = replication_hook(self.postgres_conn_id, self.database)
        return lake_lineage(hook, self.publications, str(self.lake), kinds=())

    def _idle(self, context: Context, idle: Idle, started: float) -> dict[str, Any]:
        """An idle run's result, as a submitted run would have returned it."""
        from airflow_pglogrepl.pipeline.idle import idle_summary

        confirmed = str(idle.confirmed)
        self.log.info(
            "spark-submit skipped (skip_when_idle): %s", idle.reason,
        )  # fmt: skip
        summary = idle_summary(str(self.slot_name), idle, materialize=self.materialize,
                               started=started, history=bool(self._history()))  # fmt: skip
        result = {**summary, "lake": self.lake, "idle": True}
        self._publish(context, confirmed, 0, idle=True)
        metrics.drain(str(self.slot_name), result)
        self.log.info("%s", drain_paragraph(result, lake_root=str(self.lake)))
        return result

    def _publish(self, context: Context, confirmed: str, changes: int, *, idle: bool,
                 result: dict[str, Any] | None = None) -> None:  # fmt: skip
        """``confirmed_flush_lsn`` to XCom and the lake's Asset event. Airflow emits the event
        on every success; ``idle`` in its extra lets a DAG scheduled on the lake tell a run
        that changed nothing (a condition on ``triggering_asset_events``)."""
        context["ti"].xcom_push(key="confirmed_flush_lsn", value=confirmed)
        for outlet in self.outlets or []:
            if isinstance(outlet, AssetAlias):  # the tables the run changed (operators.assets)
                for asset, extra in table_events(result or {}, str(self.lake)):
                    context["outlet_events"][outlet].add(asset, extra=extra)
                continue
            context["outlet_events"][outlet].extra = {
                "slot": self.slot_name,
                "confirmed_flush_lsn": confirmed,
                "changes": changes,
                "idle": idle,
            }

    def _app_args(self) -> list[str]:
        args = ["--slot", str(self.slot_name), "--lake", str(self.lake)]
        args += ["--max-window-bytes", str(int(self.max_window_bytes))]
        args += ["--publication", *[str(p) for p in self.publications]]
        if str(self.max_windows) not in ("None", ""):  # templated: may render as text
            args += ["--max-windows", str(int(str(self.max_windows)))]
        if self.accept_source_change:
            args.append("--accept-source-change")
        if not self.materialize:
            args.append("--no-materialize")
        args += ["--small-merge-rows", str(int(str(self.small_merge_rows)))]
        stall = str(self.merge_stall_seconds)  # templated: may render as text
        args += ["--merge-stall-seconds", "0" if stall in ("None", "") else str(float(stall))]
        args += ["--on-quarantine", self.on_quarantine]
        args += ["--on-incomplete", self.on_incomplete]
        accepted = self.accept_incomplete
        for table in [accepted] if isinstance(accepted, str) else accepted:
            args += ["--accept-incomplete", str(table)]
        for table in self._history():
            args += ["--history", table]
        if self._history() and self.history_spark_bytes not in (None, "", "None"):
            args += ["--history-spark-bytes", str(int(str(self.history_spark_bytes)))]
        for table in self._resync():
            args += ["--resync", table]
        for table in self._parity():
            args += ["--parity", table]
        if str(self.parity_repair).strip().lower() == "true":  # (a template renders text)
            args += ["--parity-repair"]
        args += ["--backfill-chunk-rows", str(int(str(self.backfill_chunk_rows)))]
        if self.reader not in READERS:
            raise ValueError(f"reader must be one of {READERS}, not {self.reader!r}")
        args += ["--reader", self.reader]
        if self.follow:
            args += ["--follow", "--window-seconds", _seconds("window_seconds",
                                                              self.window_seconds)]  # fmt: skip
            if str(self.follow_seconds) not in ("None", ""):
                args += ["--follow-for", _seconds("follow_seconds", self.follow_seconds)]
            args += ["--merge-seconds", _seconds("merge_seconds", self.merge_seconds)]
        return args + state_vectors_args(self.state_deletion_vectors)


def _seconds(name: str, value: object) -> str:
    """A positive number of seconds, rendered (it may come from a template), for argv."""
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return repr(seconds)


def _names(given: Sequence[str] | str) -> list[str]:
    """Table names as rendered: a list, or one string of names split by commas (what a
    trigger's param gives)."""
    names = given.split(",") if isinstance(given, str) else given
    return [str(n).strip() for n in names if str(n).strip()]
