"""The lake's object store from an Airflow connection: the lake URIs refused before anything
runs (credentials in them, schemes and keys the engines would read differently), the store an
``aws`` connection's fields describe and the worker's defaults it falls back to, its secrets
masked as soon as they are read, and the look at the bucket that names what is wrong first."""

from __future__ import annotations

import json
import socket
import time

import pytest

from airflow_pglogrepl.exceptions import LakeLocationError, LakeStoreUnreachableError
from airflow_pglogrepl.hooks import base
from airflow_pglogrepl.hooks.object_store import (
    _look_failed,
    check_bucket,
    check_lake_uri,
    lake_store,
    store_of,
)
from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.storage import ObjectStore
from airflow_pglogrepl.testing.pgcluster import free_port
from tests.support.s3 import S3Server


@pytest.mark.parametrize(
    "lake_root",
    ["/tmp/lake", "relative/lake", "file:///tmp/lake", "s3://bkt/lake", "s3a://b-1.x/a/b_c-1/",
     "s3://bkt", "s3://bkt/"],
)  # fmt: skip
def test_plain_paths_and_plain_bucket_keys_are_taken(lake_root: str) -> None:
    check_lake_uri(lake_root)


@pytest.mark.parametrize("lake_root", [" /tmp/lake", "/tmp/lake ", "/tmp/la\nke"])
def test_a_local_path_with_blanks_at_its_ends_or_a_newline_is_refused(lake_root: str) -> None:
    with pytest.raises(LakeLocationError, match="leading or trailing blanks or a newline"):
        check_lake_uri(lake_root)


@pytest.mark.parametrize(
    ("lake_root", "named"),
    [
        ("s3://AKID:SEKRET@bucket/lake", "holds credentials"),
        ("s3a://AKID@bucket/lake", "holds credentials"),
        ("gs://bucket/lake", "does not reach"),
        ("gs://key:SEKRET@bucket/lake", "does not reach"),
        ("abfss://c@acct.dfs.core.windows.net/lake", "does not reach"),
        # what delta-rs and pyarrow would read as different keys, or a SEKRET in a query
        ("s3://bucket/x?aws_SEKRET_access_key=SEKRET", "other than letters"),
        ("s3://bucket/lake#SEKRET", "other than letters"),
        ("s3://bucket/x;SEKRET", "other than letters"),
        ("s3://bucket/my lake", "other than letters"),
        ("s3://bucket/my%20lake", "other than letters"),
        ("S3://bucket/lake", "in lower case"),
        ("s3://Bucket_Name/lake", "not a bucket name"),
        ("s3://AKID:SEKRET@[bucket/lake", "holds credentials"),
        ("file:///tmp/lake?secret=SEKRET", "query or a fragment"),
        # delta-rs resolves dot segments and pyarrow does not; one slash is no URI
        ("s3://bkt/a/../b", "'.' or '..' part"),
        ("s3://bkt/./lake", "'.' or '..' part"),
        ("s3://bkt//lake", "'.' or '..' part"),
        ("s3://bkt/a//b", "'.' or '..' part"),
        ("s3:/bkt/lake", "not followed by //"),
    ],
)
def test_a_lake_with_credentials_or_an_unreachable_scheme_is_refused(
    lake_root: str, named: str
) -> None:
    with pytest.raises(LakeLocationError, match=named) as caught:
        check_lake_uri(lake_root)
    assert "SEKRET" not in str(caught.value)


def test_the_workers_endpoint_and_region_reach_every_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection without an endpoint: delta-rs followed the worker's AWS_ENDPOINT_URL, and
    pyarrow and Spark did not; one lake's commits and files went to two stores."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    store = store_of("AKID", "pw", None, {})
    assert (store.endpoint_url, store.region) == ("http://127.0.0.1:9", "eu-west-1")
    assert lake_store(None, "s3://b1b/lake") == ObjectStore(
        endpoint_url="http://127.0.0.1:9", region="eu-west-1"
    )
    with storage.using(store):
        assert storage.spark_settings()["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9"


def test_a_connection_asking_for_another_identity_is_refused() -> None:
    with pytest.raises(LakeLocationError, match="role_arn"):
        store_of(None, None, None, {"role_arn": "arn:aws:iam::1:role/x"})


def test_a_missing_bucket_or_a_silent_store_is_named_before_anything_starts(
    s3_server: S3Server,
) -> None:
    """Both came as delta-rs' own text from the middle of a run, in terminal colours."""
    with pytest.raises(LakeLocationError, match="'nowhere-1' does not exist at http://127"):
        check_bucket(s3_server.store, "s3://nowhere-1/lake")
    silent = ObjectStore(endpoint_url=f"http://127.0.0.1:{free_port()}", region="us-east-1",
                         access_key_id="A", secret_access_key="SEKRET")  # fmt: skip
    with pytest.raises(LakeStoreUnreachableError, match="could not be looked at") as caught:
        check_bucket(silent, "s3://b1b/lake")
    assert caught.value.retryable and "SEKRET" not in str(caught.value)
    check_bucket(s3_server.store, f"s3://{s3_server.new_bucket()}/lake")


def test_a_store_that_never_answers_is_named_within_the_looks_timeout() -> None:
    """A server that takes the connection and says nothing (a proxy or a firewall dropping
    the replies): the look gives up after its timeout instead of holding the task."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the kernel's backlog; nothing ever replies
        port = silent.getsockname()[1]
        store = ObjectStore(endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1",
                            access_key_id="A", secret_access_key="S")  # fmt: skip
        began = time.monotonic()
        with pytest.raises(LakeStoreUnreachableError):
            check_bucket(store, "s3://b1b/lake", timeout_s=1.0)
        assert time.monotonic() - began < 8  # pyarrow alone: about 11 s (3 s, 3 attempts)


def test_a_store_named_for_a_local_lake_is_refused() -> None:
    with pytest.raises(LakeLocationError, match="is a local path"):
        lake_store("lake_store", "/tmp/lake")
    assert lake_store(None, "/tmp/lake") is None
    assert lake_store(None, "s3://b1b/lake") == ObjectStore()  # the engines' own defaults


def test_an_aws_connection_describes_the_store() -> None:
    assert store_of("AKID", "pw", None, {"region_name": "eu-west-1",
                    "endpoint_url": "http://minio:9000"}) == ObjectStore(
        endpoint_url="http://minio:9000", region="eu-west-1", access_key_id="AKID",
        secret_access_key="pw",
    )  # fmt: skip
    from_extra = store_of(
        None,
        None,
        "minio.internal:9000",
        {"aws_access_key_id": "A", "aws_secret_access_key": "S", "aws_session_token": "T"},
    )
    assert from_extra == ObjectStore(
        endpoint_url="https://minio.internal:9000",
        access_key_id="A",
        secret_access_key="S",
        session_token="T",
    )
    nested = store_of(None, None, None, {"service_config": {"s3": {"endpoint_url": "http://x"}}})
    assert nested.endpoint_url == "http://x"


def test_a_connection_s_keys_are_masked_as_soon_as_they_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    masked: list[str] = []
    monkeypatch.setattr(base, "mask", masked.append)
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_MASKED", json.dumps({
        "conn_type": "aws", "login": "AKID", "password": "s3cr3t",
        "extra": {"aws_session_token": "t0ken", "endpoint_url": "http://127.0.0.1:9"},
    }))  # fmt: skip
    store = lake_store("lake_masked", "s3://bkt/lake")
    assert store is not None and store.secret_access_key == "s3cr3t"
    assert masked == ["s3cr3t", "t0ken"]


def test_a_refused_look_needs_a_person_and_a_silent_store_may_answer_next_time() -> None:
    denied = _look_failed(OSError("AWS Error ACCESS_DENIED during HeadBucket"), "bkt", "AWS S3")
    assert isinstance(denied, LakeLocationError) and not denied.retryable
    assert "refused the lake's keys for bucket 'bkt'" in str(denied)
    assert "Fix: give the lake's connection keys allowed to list" in str(denied)
    moved = _look_failed(OSError("HTTP 301 PermanentRedirect"), "bkt", "AWS S3 (us-east-1)")
    assert isinstance(moved, LakeLocationError) and not moved.retryable
    assert "in another region than AWS S3 (us-east-1)" in str(moved)
    assert "Fix: set region_name" in str(moved)
    silent = _look_failed(OSError("curlCode: 28, Timeout was reached"), "bkt", "http://x:9")
    assert isinstance(silent, LakeStoreUnreachableError) and silent.retryable
    assert "could not be looked at: curlCode: 28" in str(silent)


def test_a_store_that_does_not_answer_on_a_port_holding_301_is_unreachable_not_elsewhere() -> None:
    """The failure's text names the endpoint: a port like 33017 holds "301", which was taken
    for an HTTP redirect to another region (a person's error, not retried) instead of a store
    that did not answer (retried). A CI run hit it on a free port of 33017."""
    from airflow_pglogrepl.hooks.object_store import _look_failed

    refused = OSError(
        "When getting information for key 'lake' in bucket 'b1b': AWS Error NETWORK_CONNECTION "
        "during HeadObject operation: curlCode: 7, Could not connect to server; Details: Failed "
        "to connect to 127.0.0.1:33017 after 0 ms: Could not connect to server"
    )
    found = _look_failed(refused, "b1b", "http://127.0.0.1:33017")
    assert isinstance(found, LakeStoreUnreachableError), found
    moved = OSError("AWS Error UNKNOWN (HTTP status 301) during HeadObject operation")
    assert "another region" in str(_look_failed(moved, "b1b", "http://127.0.0.1:9000"))
