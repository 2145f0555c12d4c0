"""Scheduled incremental drain: initial snapshot (first run) -> slot health -> drain -> lag report
and lake upkeep.

The DAG bootstraps itself: while the lake holds nothing, ``initial_snapshot`` creates the slot
with an exported snapshot and copies the published tables on Spark at exactly the slot's start
(a slot that already exists next to an empty lake is re-created for that: nothing depends on it
yet). Once the lake holds the snapshot, or windows drained without one, it does nothing and the
drain continues from the slot.

Everything comes from params (defaults below) and Airflow connections: the publisher
(``postgres_conn_id``), and Spark (``PGLOGREPL_SPARK_CONN_ID``, default ``spark_local``; it must
exist, e.g. ``AIRFLOW_CONN_SPARK_LOCAL='{"conn_type": "spark", "host": "local[*]"}'``). The
lake root is ``PGLOGREPL_LAKE`` (a path, or ``s3://bucket/prefix`` with the store's ``aws``
connection named in ``PGLOGREPL_LAKE_CONN_ID``: docs/object-storage.md) and the schedule
``PGLOGREPL_DRAIN_SCHEDULE``. One run at a time, no
catch-up: each run drains what the slot holds when it starts, in windows of
``max_window_bytes``. A table the WAL could not keep equal to the source (added to the
publication holding rows, a partition attached or detached) is copied again online by the drain
(docs/drain.md, "Online backfill"); a manual trigger with ``resync`` names tables to copy again
the same way, and one with ``parity`` tables to check against the source.

Two ways to start it. ``PGLOGREPL_DRAIN_SCHEDULE`` is a cron expression or preset (``@hourly`` by
default), or ``changes``: the DAG is then scheduled on an Asset watched by the slot's event
trigger (``SlotChangesTrigger`` in an ``AssetWatcher``, run by the triggerer), and a run starts
once per burst of published changes, none while the database is idle. The watcher reads the
publisher's connection, the slot and the publications from ``PGLOGREPL_PUBLISHER_CONN_ID``,
``PGLOGREPL_SLOT`` and ``PGLOGREPL_PUBLICATIONS`` (comma-separated), with the params' defaults,
and polls the slot every ``PGLOGREPL_TRIGGER_POLL_SECONDS`` (10 by default). It also starts a
run when the slot holds ``PGLOGREPL_TRIGGER_MAX_RETAINED_BYTES`` of WAL (256 MiB by default)
whatever it holds: writes to tables outside the publications start no burst, yet the slot
keeps their WAL until a drain moves it. The trigger watches a slot that exists: start the first
run by hand (it takes the initial snapshot, which creates the slot); until then the triggerer
logs that the slot does not exist.

``history`` (a param: tables, or ``["*"]`` for all) keeps ``history/<table>`` beside ``state/``:
every version of each row (docs/history.md). The drain emits an Asset event of each lake table it
changed; ``pglogrepl_table_report`` below is scheduled on one of them
(``PGLOGREPL_REPORT_TABLE``, ``public.pgbench_accounts`` by default) and runs only after drains
that changed that table, reading what each did from its event's ``extra``.

After the drain, ``upkeep`` compacts, vacuums and checkpoints the lake (``LakeUpkeepOperator``)
under the same writer lock, so it never runs beside a drain or snapshot (it is skipped, not
failed, if one holds the lock: the next run maintains the lake). VACUUM keeps every version of
the last ``upkeep_keep_hours`` (and from ``upkeep_keep_lsn``, when set) readable, never less than
``upkeep_min_retention_hours``.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, Param, task

from airflow_pglogrepl.operators.assets import lake_table_asset
from airflow_pglogrepl.operators.drain import SlotDrainOperator
from airflow_pglogrepl.operators.slots import SlotHealthCheckOperator
from airflow_pglogrepl.operators.snapshot import InitialSnapshotOperator
from airflow_pglogrepl.operators.upkeep import LakeUpkeepOperator

LAKE_ROOT = os.environ.get("PGLOGREPL_LAKE") or "/tmp/pglogrepl-lake"
LAKE_CONN_ID = os.environ.get("PGLOGREPL_LAKE_CONN_ID") or None
PUBLISHER = os.environ.get("PGLOGREPL_PUBLISHER_CONN_ID", "pglogrepl_publisher")
SLOT = os.environ.get("PGLOGREPL_SLOT") or "pglogrepl_lake"
PUBLICATIONS = (os.environ.get("PGLOGREPL_PUBLICATIONS") or "pglogrepl_lake").split(",")
REPORT_TABLE = os.environ.get("PGLOGREPL_REPORT_TABLE") or "public.pgbench_accounts"


def _schedule() -> Any:
    """The cron schedule, or (``changes``) an Asset the slot's event trigger watches."""
    wanted = os.environ.get("PGLOGREPL_DRAIN_SCHEDULE", "@hourly")
    if wanted != "changes":
        return wanted
    from airflow_pglogrepl.triggers.slot_changes import SlotChangesTrigger

    poll_seconds = float(os.environ.get("PGLOGREPL_TRIGGER_POLL_SECONDS") or 10)
    # WAL the slot holds for changes no drain stores (tables outside the publications, other
    # databases) starts a drain too, which moves the slot past it
    retained = int(os.environ.get("PGLOGREPL_TRIGGER_MAX_RETAINED_BYTES") or 256 << 20)
    trigger = SlotChangesTrigger(postgres_conn_id=PUBLISHER, slot_name=SLOT,
                                 publications=PUBLICATIONS, poll_interval=poll_seconds,
                                 max_retained_bytes=retained)  # fmt: skip
    watched = Asset(
        f"pglogrepl-slot-{SLOT}", watchers=[AssetWatcher(name=f"{SLOT}-changes", trigger=trigger)]
    )
    return [watched]


with DAG(
    dag_id="pglogrepl_incremental_drain",
    schedule=_schedule(),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        "postgres_conn_id": Param(PUBLISHER, type="string"),
        "slot": Param(SLOT, type="string"),
        "publications": Param(PUBLICATIONS, type="array"),
        # tables whose history/ the drain keeps (every version of each row); ["*"]: all
        "history": Param([], type="array"),
        "max_window_bytes": Param(64 * 1024 * 1024, type="integer", minimum=1),
        "max_windows": Param(None, type=["null", "integer"]),
        "small_merge_rows": Param(100_000, type="integer", minimum=0),
        "max_retained_bytes": Param(None, type=["null", "integer"]),
        "snapshot_tasks_per_table": Param(None, type=["null", "integer"]),
        "snapshot_rows_per_task": Param(1_000_000, type="integer", minimum=1),
        # trigger with tables here: copied again while the drain goes on (resync), or checked
        # against the source (parity; a difference fails the drain task, naming the keys)
        "resync": Param([], type="array"),
        "parity": Param([], type="array"),
        "parity_repair": Param(False, type="boolean"),
        # the lake's upkeep: what VACUUM keeps readable, and when a table is compacted
        "upkeep_keep_lsn": Param(None, type=["null", "string"]),
        "upkeep_keep_hours": Param(7 * 24, type=["null", "number"], minimum=0),
        "upkeep_min_retention_hours": Param(7 * 24, type="number", minimum=0),
        "upkeep_max_files": Param(100, type="integer", minimum=1),
        "upkeep_max_small_files": Param(20, type="integer", minimum=2),
    },
    tags=["pglogrepl"],
) as dag:
    spark_conn_id = os.environ.get("PGLOGREPL_SPARK_CONN_ID", "spark_local")
    snapshot = InitialSnapshotOperator(
        task_id="initial_snapshot",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        conn_id=spark_conn_id,
        slot_name="{{ params.slot }}",
        publications="{{ params.publications }}",
        lake=LAKE_ROOT,
        lake_conn_id=LAKE_CONN_ID,
        tasks_per_table="{{ params.snapshot_tasks_per_table }}",
        rows_per_task="{{ params.snapshot_rows_per_task }}",
        bootstrap=True,
    )
    health = SlotHealthCheckOperator(
        task_id="slot_health",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        slot_name="{{ params.slot }}",
        plugin="pgoutput",
        allow_active=False,
        max_retained_bytes=None,
    )
    drain = SlotDrainOperator(
        task_id="drain",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        conn_id=spark_conn_id,
        slot_name="{{ params.slot }}",
        publications="{{ params.publications }}",
        lake=LAKE_ROOT,
        lake_conn_id=LAKE_CONN_ID,
        max_window_bytes="{{ params.max_window_bytes }}",
        max_windows="{{ params.max_windows }}",
        small_merge_rows="{{ params.small_merge_rows }}",
        resync="{{ params.resync }}",
        parity="{{ params.parity }}",
        parity_repair="{{ params.parity_repair }}",
        history="{{ params.history }}",
    )

    @task
    def lag_report(params: dict[str, Any] | None = None) -> dict[str, Any]:
        """How far the slot is behind now, and how much WAL it holds on the publisher."""
        from airflow_pglogrepl.hooks.for_connection import replication_hook

        assert params is not None
        hook = replication_hook(params["postgres_conn_id"])
        slot = hook.get_slot(params["slot"])
        lag = slot.current_lsn - slot.confirmed_flush_lsn if slot.confirmed_flush_lsn else None
        report = {"slot": slot.name, "lag_bytes": lag, "retained_bytes": slot.retained_bytes,
                  "confirmed_flush_lsn": str(slot.confirmed_flush_lsn),
                  "current_lsn": str(slot.current_lsn), "wal_status": slot.wal_status}  # fmt: skip
        print(f"lag report: {report}")
        return report

    upkeep = LakeUpkeepOperator(
        task_id="upkeep",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        slot_name="{{ params.slot }}",
        lake=LAKE_ROOT,
        lake_conn_id=LAKE_CONN_ID,
        keep_lsn="{{ params.upkeep_keep_lsn }}",
        keep_hours="{{ params.upkeep_keep_hours }}",
        min_retention_hours="{{ params.upkeep_min_retention_hours }}",
        max_files="{{ params.upkeep_max_files }}",
        max_small_files="{{ params.upkeep_max_small_files }}",
    )

    snapshot >> health >> drain >> [lag_report(), upkeep]


REPORTED = lake_table_asset(LAKE_ROOT, REPORT_TABLE, "state")

with DAG(
    dag_id="pglogrepl_table_report",
    schedule=[REPORTED],
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    tags=["pglogrepl"],
) as report_dag:

    @task
    def changed(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """What each drain that changed the table did: its extra (table, kind, lsn, Delta
        version, changes): where a downstream job would start reading. Read under the table's
        Asset alone: Airflow files each event under the alias it came through too."""
        extras = [dict(event.extra) for key, events in (triggering_asset_events or {}).items()
                  if getattr(key, "uri", None) == REPORTED.uri for event in events]  # fmt: skip
        for extra in extras:
            print(f"{extra.get('table')} changed: {extra}")
        return extras

    changed()
