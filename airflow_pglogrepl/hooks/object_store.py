"""The object store of a lake, from an Airflow connection (``lake_conn_id`` of the operators).

The Amazon provider's ``aws`` connection is the one to use (it need not be installed: only the
connection's fields are read): login and password are the access key id and secret, or the
extra's ``aws_access_key_id``/``aws_secret_access_key``; the extra's ``endpoint_url`` (or
``service_config.s3.endpoint_url``, or the connection's host) names an S3-compatible server;
``region_name`` and ``aws_session_token`` as the Amazon provider reads them. No connection: each
engine's own defaults (``AWS_*`` variables, the instance's role).

The store is resolved in the task, never in the DAG file, and its secrets are masked in the task
log as soon as they are read.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from airflow_pglogrepl.lake.layout import is_local
from airflow_pglogrepl.lake.storage import ObjectStore, is_object_store


class LakeLocationError(ValueError):
    """A lake URI (``sink``) that cannot be used as given; nothing was started."""


def check_sink(sink: str) -> None:
    """Refuse a lake URI that carries credentials or that no engine here can reach."""
    parsed = urlparse(sink)
    if not is_local(sink) and not is_object_store(sink):
        raise LakeLocationError(
            f"the lake URI is on {parsed.scheme}://, which the lake does not reach: "
            f"a local path or file: URI, or s3:// (s3a://) on S3 or an S3-compatible store. "
            f"docs/object-storage.md says which settings carry over to ABFS and GCS"
        )
    if parsed.username or parsed.password:
        raise LakeLocationError(
            f"the lake URI for bucket {parsed.hostname!r} holds credentials: they would be "
            f"shown in XCom, Asset events and the task log. Fix: put them in an Airflow "
            f"connection of type aws and name it as lake_conn_id; the sink is then "
            f"{parsed.scheme}://{parsed.hostname}{parsed.path}"
        )


def lake_store(conn_id: str | None, sink: str) -> ObjectStore | None:
    """The object store of the lake at ``sink`` (None: a local lake), its secrets masked."""
    check_sink(sink)
    if not is_object_store(sink):
        if conn_id:
            raise LakeLocationError(
                f"lake_conn_id {conn_id!r} is given but the lake {sink!r} is a local path. "
                f"Fix: give the lake's s3:// URI as sink, or leave lake_conn_id out"
            )
        return None
    if not conn_id:
        return ObjectStore()
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    store = store_of(conn.login, conn.password, conn.host, conn.extra_dejson)
    _mask(store)
    return store


def store_of(login: str | None, password: str | None, host: str | None,
             extra: dict[str, Any]) -> ObjectStore:  # fmt: skip
    """The store an ``aws`` connection's fields describe."""
    service = extra.get("service_config", {}).get("s3", {})
    endpoint = extra.get("endpoint_url") or service.get("endpoint_url") or host or None
    if endpoint and "://" not in endpoint:
        endpoint = f"https://{endpoint}"
    return ObjectStore(
        endpoint_url=endpoint,
        region=extra.get("region_name") or None,
        access_key_id=login or extra.get("aws_access_key_id") or None,
        secret_access_key=password or extra.get("aws_secret_access_key") or None,
        session_token=extra.get("aws_session_token") or None,
    )


def _mask(store: ObjectStore) -> None:
    from airflow_pglogrepl.operators._spark import mask

    for secret in store.secrets():
        mask(secret)
