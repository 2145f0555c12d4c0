"""Test DAGs: preflight -> publication -> subscription -> ready -> lag, poke and deferrable.

Everything comes from params so tests can point the same DAG at different clusters, databases
and (hostile) names.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG

from airflow_pglogrepl.operators.preflight import ReplicationPreflightOperator
from airflow_pglogrepl.operators.publication import CreatePublicationOperator
from airflow_pglogrepl.operators.subscription import CreateSubscriptionOperator
from airflow_pglogrepl.sensors.progress import ReplicationLagSensor
from airflow_pglogrepl.sensors.subscription import SubscriptionReadySensor

PARAMS: dict[str, Any] = {
    "publisher_conn_id": "flow_pub",
    "subscriber_conn_id": "flow_sub",
    "publication": "flow_pub",
    "subscription": "flow_sub",
    "tables": ["public.orders"],
}


def build(dag_id: str, deferrable: bool) -> DAG:
    with DAG(
        dag_id=dag_id,
        schedule=None,
        catchup=False,
        params=PARAMS,
        render_template_as_native_obj=True,
    ) as dag:
        preflight = ReplicationPreflightOperator(
            task_id="preflight",
            publisher_conn_id="{{ params.publisher_conn_id }}",
            subscriber_conn_id="{{ params.subscriber_conn_id }}",
            publication="{{ params.publication }}",
            tables="{{ params.tables }}",
        )
        publication = CreatePublicationOperator(
            task_id="create_publication",
            publication="{{ params.publication }}",
            postgres_conn_id="{{ params.publisher_conn_id }}",
            tables="{{ params.tables }}",
        )
        subscription = CreateSubscriptionOperator(
            task_id="create_subscription",
            subscription="{{ params.subscription }}",
            publications=["{{ params.publication }}"],
            publisher_conn_id="{{ params.publisher_conn_id }}",
            subscriber_conn_id="{{ params.subscriber_conn_id }}",
        )
        ready = SubscriptionReadySensor(
            task_id="wait_ready",
            subscription="{{ params.subscription }}",
            subscriber_conn_id="{{ params.subscriber_conn_id }}",
            poke_interval=0.1,
            timeout=300,
            deferrable=deferrable,
        )
        lag = ReplicationLagSensor(
            task_id="wait_lag",
            subscription="{{ params.subscription }}",
            subscriber_conn_id="{{ params.subscriber_conn_id }}",
            publisher_conn_id="{{ params.publisher_conn_id }}",
            max_lag_bytes=1024 * 1024,
            poke_interval=0.1,
            timeout=300,
            deferrable=deferrable,
        )
        preflight >> publication >> subscription >> ready >> lag
    return dag


setup = build("pglogrepl_setup", deferrable=False)
setup_deferrable = build("pglogrepl_setup_deferrable", deferrable=True)

with DAG(
    dag_id="pglogrepl_ready_only",
    schedule=None,
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
) as ready_only:
    SubscriptionReadySensor(
        task_id="wait_ready",
        subscription="{{ params.subscription }}",
        subscriber_conn_id="{{ params.subscriber_conn_id }}",
        max_sync_errors=2,
        poke_interval=0.5,
        timeout=600,
    )
