"""Sensor-gated cutover from one PostgreSQL to another with native logical replication.

preflight -> publication -> subscription -> every table ready -> small lag -> no apply errors
-> approval -> write fence -> catch-up to the fence LSN -> sequence sync -> parity -> finalize,
then a summary (outcome, versions, fence LSN, parity and the write downtime) whatever happened.

The same DAG upgrades to a new major version: the subscriber runs the new version (see the
runbook "Upgrade to a new major version").

Nothing before the fence changes what the application sees: a failed gate there simply stops the
run (re-run it once fixed; every step is idempotent). From the fence on, a failure releases the
fence (``release_fence`` runs only when something failed) so the old primary takes writes again,
and nothing is dropped: the subscription is finalized only after parity passed.

Everything is a param or a connection: the publisher (old primary) and subscriber (new primary)
connection ids, the tables, the application roles to fence. ``require_approval`` (default on)
holds the run at an Airflow approval task (human in the loop) before the fence; with it off the
run goes straight on, for rehearsals and the demo. Trigger with e.g.::

    airflow dags trigger pglogrepl_cutover -c '{"tables": ["public.orders"],
        "fence_roles": ["orders_app"]}'
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG, Param, task

from airflow_pglogrepl.operators.conflicts import SubscriptionErrorCheckOperator
from airflow_pglogrepl.operators.fence import WriteFenceOperator, WriteFenceReleaseOperator
from airflow_pglogrepl.operators.finalize import FinalizeCutoverOperator
from airflow_pglogrepl.operators.parity import TableParityCheckOperator
from airflow_pglogrepl.operators.preflight import ReplicationPreflightOperator
from airflow_pglogrepl.operators.publication import CreatePublicationOperator
from airflow_pglogrepl.operators.sequences import SyncSequencesOperator
from airflow_pglogrepl.operators.subscription import CreateSubscriptionOperator
from airflow_pglogrepl.operators.summary import CutoverSummaryOperator
from airflow_pglogrepl.sensors.progress import LsnCatchUpSensor, ReplicationLagSensor
from airflow_pglogrepl.sensors.subscription import SubscriptionReadySensor

PUB = "{{ params.publisher_conn_id }}"
SUB = "{{ params.subscriber_conn_id }}"
GATE_TIMEOUT_S = int(os.environ.get("PGLOGREPL_GATE_TIMEOUT_S", "3600"))  # each sensor's limit
FENCE_GRACE_S = float(os.environ.get("PGLOGREPL_FENCE_GRACE_S", "10"))  # open transactions

with DAG(
    dag_id="pglogrepl_cutover",
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        "publisher_conn_id": Param("pglogrepl_publisher", type="string"),
        "subscriber_conn_id": Param("pglogrepl_subscriber", type="string"),
        "publication": Param("pglogrepl_cutover", type="string"),
        "subscription": Param("pglogrepl_cutover", type="string"),
        "tables": Param([], type="array", description="schema.table names to move"),
        "fence_roles": Param([], type="array", description="application roles to fence"),
        "max_lag_bytes": Param(16 * 1024 * 1024, type="integer", minimum=0),
        "require_approval": Param(True, type="boolean"),
        "sequence_margin": Param(0, type="integer", minimum=0),
        "reverse_replication": Param(False, type="boolean"),
    },
    tags=["pglogrepl", "cutover"],
) as dag:
    preflight = ReplicationPreflightOperator(
        task_id="preflight",
        publisher_conn_id=PUB,
        subscriber_conn_id=SUB,
        publication="{{ params.publication }}",
        tables="{{ params.tables }}",
    )
    publication = CreatePublicationOperator(
        task_id="create_publication",
        postgres_conn_id=PUB,
        publication="{{ params.publication }}",
        tables="{{ params.tables }}",
    )
    subscription = CreateSubscriptionOperator(
        task_id="create_subscription",
        subscription="{{ params.subscription }}",
        publications=["{{ params.publication }}"],
        publisher_conn_id=PUB,
        subscriber_conn_id=SUB,
    )
    ready = SubscriptionReadySensor(
        task_id="wait_tables_ready",
        subscription="{{ params.subscription }}",
        subscriber_conn_id=SUB,
        poke_interval=2,
        timeout=GATE_TIMEOUT_S,
    )
    lag = ReplicationLagSensor(
        task_id="wait_small_lag",
        subscription="{{ params.subscription }}",
        subscriber_conn_id=SUB,
        publisher_conn_id=PUB,
        max_lag_bytes="{{ params.max_lag_bytes }}",
        poke_interval=2,
        timeout=GATE_TIMEOUT_S,
    )
    apply_errors = SubscriptionErrorCheckOperator(
        task_id="check_apply_errors",
        subscription="{{ params.subscription }}",
        subscriber_conn_id=SUB,
        publisher_conn_id=PUB,
    )

    @task.branch(task_id="approval_gate")
    def approval_gate(params: dict[str, Any] | None = None) -> str:
        """Hold for a human before the fence, unless the run says approval is not required."""
        assert params is not None
        return "approve_cutover" if params["require_approval"] else "approval_not_required"

    approve = ApprovalOperator(
        task_id="approve_cutover",
        subject="Cut over {{ params.tables }} to the new primary?",
        body=(
            "Tables are in sync and the lag is below {{ params.max_lag_bytes }} bytes. Approving "
            "fences writes of {{ params.fence_roles }} on the old primary."
        ),
        fail_on_reject=True,
    )
    not_required = EmptyOperator(task_id="approval_not_required")
    fence = WriteFenceOperator(
        task_id="write_fence",
        postgres_conn_id=PUB,
        roles="{{ params.fence_roles }}",
        tables="{{ params.tables }}",
        grace_period=FENCE_GRACE_S,
        trigger_rule="none_failed_min_one_success",
    )
    catch_up = LsnCatchUpSensor(
        task_id="catch_up_to_fence",
        target_lsn="{{ ti.xcom_pull(task_ids='write_fence', key='fence_lsn') }}",
        subscription="{{ params.subscription }}",
        subscriber_conn_id=SUB,
        poke_interval=1,
        timeout=GATE_TIMEOUT_S,
    )
    sequences = SyncSequencesOperator(
        task_id="sync_sequences",
        publisher_conn_id=PUB,
        subscriber_conn_id=SUB,
        tables="{{ params.tables }}",
        margin="{{ params.sequence_margin }}",
    )
    parity = TableParityCheckOperator(
        task_id="parity_check",
        publisher_conn_id=PUB,
        subscriber_conn_id=SUB,
        tables="{{ params.tables }}",
    )
    finalize = FinalizeCutoverOperator(
        task_id="finalize",
        subscription="{{ params.subscription }}",
        subscriber_conn_id=SUB,
        publisher_conn_id=PUB,
        tables="{{ params.tables }}",
        reverse_publication="{{ 'pglogrepl_reverse' if params.reverse_replication else None }}",
        reverse_subscription="{{ 'pglogrepl_reverse' if params.reverse_replication else None }}",
    )
    # The rollback path: runs only when the fence or a gate after it failed.
    release = WriteFenceReleaseOperator(
        task_id="release_fence",
        postgres_conn_id=PUB,
        roles="{{ params.fence_roles }}",
        trigger_rule="one_failed",
    )

    summary = CutoverSummaryOperator(task_id="cutover_summary")

    preflight >> publication >> subscription >> ready >> lag >> apply_errors
    gate = approval_gate()
    apply_errors >> gate >> [approve, not_required] >> fence
    fence >> catch_up >> sequences >> parity >> finalize
    [fence, catch_up, sequences, parity] >> release
    [finalize, release] >> summary
