"""Test DAG: the hook inside a real Airflow task (slot round trip), result to XCom."""

from __future__ import annotations

from typing import Any

from airflow.sdk import dag, task


@dag(
    dag_id="pglogrepl_smoke",
    schedule=None,
    catchup=False,
    params={"conn_id": "pglogrepl_publisher", "slot": "smoke_slot"},
)
def pglogrepl_smoke() -> None:
    @task
    def slot_round_trip(params: dict[str, Any] | None = None) -> dict[str, Any]:
        from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook

        assert params is not None
        hook = PgLogicalReplicationHook(postgres_conn_id=params["conn_id"])
        hook.create_logical_slot(params["slot"])
        try:
            return hook.get_slot(params["slot"]).to_dict()
        finally:
            hook.drop_slot(params["slot"])

    slot_round_trip()


pglogrepl_smoke()
