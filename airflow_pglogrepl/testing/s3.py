"""A real S3 API server on loopback (moto's standalone server, ``moto[server,s3]``), for the
tests, the demo and the benchmarks that keep a lake in a bucket.

The server speaks S3's HTTP API as the product's engines use it (delta-rs' conditional PUTs,
pyarrow's S3 client, Hadoop's S3A): nothing is mocked in the process under test. Each lake is in
a bucket of its own; the keys are made up per session (the server checks no signature), which
is enough to prove that they reach each engine the way the product hands them over.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from airflow_pglogrepl.lake.storage import STORE_ENV, ObjectStore

REGION = "us-east-1"
_buckets = itertools.count(1)


class S3Server:
    """moto's ``ThreadedMotoServer`` on a free loopback port."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        # every request the server answers, by kind (``request_kind``): what a run costs on S3
        self.requests: Counter[str] = Counter()
        self._counting = threading.Lock()
        served = self._server._server
        assert served is not None
        served.app = self._counted(served.app)
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.store = ObjectStore(
            endpoint_url=self.endpoint, region=REGION, access_key_id="pglogrepl-test-key",
            secret_access_key=f"test-secret-{secrets.token_hex(12)}",
        )  # fmt: skip

    def _counted(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        def counted(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            kind = request_kind(environ["REQUEST_METHOD"], environ.get("QUERY_STRING", ""))
            with self._counting:
                self.requests[kind] += 1
            return app(environ, start_response)

        return counted

    def client(self) -> Any:
        import boto3

        return boto3.client(  # type: ignore[no-untyped-call]
            "s3", endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=self.store.access_key_id,
            aws_secret_access_key=self.store.secret_access_key,
        )  # fmt: skip

    def new_bucket(self) -> str:
        name = f"lake-{next(_buckets)}-{secrets.token_hex(3)}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def env(self) -> dict[str, str]:
        """What an operator puts in its application's environment for this store."""
        return {STORE_ENV: self.store.to_json()}

    def connection(self) -> dict[str, Any]:
        """The Airflow connection (type ``aws``) of this store, as ``AIRFLOW_CONN_*`` JSON."""
        return {
            "conn_type": "aws",
            "login": self.store.access_key_id,
            "password": self.store.secret_access_key,
            "extra": {"endpoint_url": self.endpoint, "region_name": REGION},
        }

    def stop(self) -> None:
        self._server.stop()


def request_kind(method: str, query: str) -> str:
    """A request's kind as S3 bills it: LIST (a listing of keys), GET, HEAD, PUT, POST, DELETE."""
    listing = method == "GET" and ("list-type=" in query or "prefix=" in query
                                   or "delimiter=" in query)  # fmt: skip
    return "LIST" if listing else method


def configure_spark(session: Any, store: ObjectStore) -> None:
    """S3A settings for ``store`` on a running session (the tests share one session; the
    product's sessions get them when made, ``lake.storage.spark_settings``)."""
    from airflow_pglogrepl.lake import storage

    conf = session.sparkContext._jsc.hadoopConfiguration()
    with storage.using(store):
        for key, value in storage.spark_settings().items():
            conf.set(key.removeprefix("spark.hadoop."), value)


def backdate(uri: str, when: float) -> None:
    """Make the object at ``s3://bucket/key`` look written at ``when`` (seconds since the
    epoch), as ``os.utime`` does to a local file: S3 has no call for it, so the server's own
    record is changed (moto serves in this process)."""
    import datetime as dt

    from moto.core import DEFAULT_ACCOUNT_ID  # type: ignore[attr-defined]
    from moto.s3.models import s3_backends

    bucket, _, key = uri.partition("://")[2].partition("/")
    found = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[bucket].keys[key]
    found.last_modified = dt.datetime.fromtimestamp(when, dt.UTC).replace(tzinfo=None)
