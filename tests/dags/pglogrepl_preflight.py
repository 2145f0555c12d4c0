"""Test DAG: ReplicationPreflightOperator in a real Airflow task; its report lands in XCom."""

from __future__ import annotations

from airflow.sdk import DAG

from airflow_pglogrepl.operators.preflight import ReplicationPreflightOperator

with DAG(
    dag_id="pglogrepl_preflight",
    schedule=None,
    catchup=False,
    render_template_as_native_obj=True,  # params.tables renders as a list, not its text
    params={
        "publisher_conn_id": "pglogrepl_publisher",
        "subscriber_conn_id": "pglogrepl_subscriber",
        "publication": None,
        "tables": ["public.preflight_dag"],
        "fix": "none",
    },
):
    ReplicationPreflightOperator(
        task_id="preflight",
        publisher_conn_id="{{ params.publisher_conn_id }}",
        subscriber_conn_id="{{ params.subscriber_conn_id }}",
        publication="{{ params.publication }}",
        tables="{{ params.tables }}",
        fix_replica_identity="{{ params.fix }}",
    )
