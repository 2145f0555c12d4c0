"""The S3 API server on loopback (``testing.s3``): buckets of their own, listed by prefix;
the store it hands out reaches the product's engines (pyarrow's S3 client writes what the
server lists) and travels to an application as the environment says; its Airflow connection
names the same keys and endpoint; an object is made to look written earlier, as ``os.utime``
does to a file; every request it answers is counted by kind."""

from __future__ import annotations

import datetime as dt

from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.storage import STORE_ENV, ObjectStore
from airflow_pglogrepl.testing.s3 import REGION, S3Server, backdate, request_kind


def test_each_bucket_is_new_and_lists_by_prefix(s3_server: S3Server) -> None:
    first, second = s3_server.new_bucket(), s3_server.new_bucket()
    assert first != second and s3_server.keys(first) == []
    client = s3_server.client()
    for key in ("lake/a", "lake/b/c", "other/d"):
        client.put_object(Bucket=first, Key=key, Body=b"x")
    assert s3_server.keys(first, "lake/") == ["lake/a", "lake/b/c"]
    assert s3_server.keys(second) == []


def test_the_store_reaches_the_products_engines(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    with storage.using(s3_server.store):
        system, path = storage.filesystem(f"s3://{bucket}/lake/t")
        with system.open_output_stream(f"{path}/part-0") as out:
            out.write(b"rows")
    assert s3_server.keys(bucket) == ["lake/t/part-0"]


def test_the_store_travels_in_the_environment_and_the_connection_names_it(
    s3_server: S3Server,
) -> None:
    store = ObjectStore.from_json(s3_server.env()[STORE_ENV])
    assert store == s3_server.store
    assert store.endpoint_url == s3_server.endpoint and store.region == REGION
    connection = s3_server.connection()
    assert connection["conn_type"] == "aws"
    assert (connection["login"], connection["password"]) == (
        store.access_key_id, store.secret_access_key)  # fmt: skip
    assert connection["extra"] == {"endpoint_url": s3_server.endpoint, "region_name": REGION}


def test_an_object_is_made_to_look_written_earlier(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="lake/_delta_log/0.json", Body=b"{}")
    when = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    backdate(f"s3://{bucket}/lake/_delta_log/0.json", when.timestamp())
    head = client.head_object(Bucket=bucket, Key="lake/_delta_log/0.json")
    assert head["LastModified"] == when


def test_every_request_is_counted_by_kind(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    before = s3_server.requests.copy()
    client.put_object(Bucket=bucket, Key="lake/a", Body=b"x")
    client.get_object(Bucket=bucket, Key="lake/a")
    client.head_object(Bucket=bucket, Key="lake/a")
    assert s3_server.keys(bucket, "lake/") == ["lake/a"]
    counted = s3_server.requests - before
    assert counted == {"PUT": 1, "GET": 1, "HEAD": 1, "LIST": 1}


def test_a_listing_is_told_from_a_read() -> None:
    assert request_kind("GET", "list-type=2&prefix=lake%2F") == "LIST"
    assert request_kind("GET", "") == "GET"
    assert request_kind("PUT", "") == "PUT"
