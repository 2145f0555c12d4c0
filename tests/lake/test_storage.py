"""The lake's store: its secrets stay out of sight, every engine is handed the same store."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_pglogrepl.hooks.object_store import (
    LakeLocationError,
    check_lake_uri,
    lake_store,
    store_of,
)
from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.storage import ObjectStore
from tests.support.s3 import S3Server

STORE = ObjectStore(endpoint_url="http://127.0.0.1:9", region="eu-west-1",
                    access_key_id="AKIDEXAMPLE", secret_access_key="s3cr3t/+=",
                    session_token="t0ken")  # fmt: skip


def test_a_store_never_shows_its_secret_or_token() -> None:
    assert "s3cr3t" not in repr(STORE) and "t0ken" not in repr(STORE)
    assert "AKIDEXAMPLE" not in repr(STORE)
    assert STORE.secrets() == ["s3cr3t/+=", "t0ken"]


def test_spark_gets_a_private_profile_file_and_no_secret_in_its_configuration() -> None:
    with storage.using(STORE):
        settings = storage.spark_settings()
    assert not any("s3cr3t" in v or "t0ken" in v for v in settings.values()), settings
    assert settings["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert settings["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9"
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    profile = settings["spark.hadoop.fs.s3a.auth.profile.file"]
    assert stat.S_IMODE(os.stat(profile).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(profile)).st_mode) == 0o700
    with open(profile, encoding="utf-8") as file:
        text = file.read()
    assert "aws_secret_access_key = s3cr3t/+=" in text and "aws_session_token = t0ken" in text


def test_without_keys_spark_finds_its_own_and_no_file_is_written() -> None:
    with storage.using(ObjectStore(region="eu-west-1")):
        settings = storage.spark_settings()
    assert "spark.hadoop.fs.s3a.aws.credentials.provider" not in settings
    assert "spark.hadoop.fs.s3a.endpoint" not in settings  # AWS itself: S3A's default endpoint


def test_delta_rs_gets_every_key_and_a_local_lake_none() -> None:
    with storage.using(STORE):
        assert storage.delta_options("/tmp/lake/changes/public.t") is None
        options = storage.delta_options("s3a://b/lake/changes/public.t")
    assert options == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t/+=",
        "AWS_SESSION_TOKEN": "t0ken", "AWS_ALLOW_HTTP": "true",
    }  # fmt: skip
    assert ObjectStore.from_json(STORE.to_json()) == STORE


def test_every_s3_spelling_is_one_bucket_and_path_for_pyarrow() -> None:
    with storage.using(STORE):
        for uri in ("s3://b/lake/", "s3a://b/lake", "s3n://b/lake"):
            system, path = storage.filesystem(uri)
            assert type(system).__name__ == "S3FileSystem" and path == "b/lake", uri


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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("secret_access_key", "x\ncredential_process = sh -c 'id > /tmp/pwned'"),
        ("access_key_id", "AKID\r"),
        ("session_token", "t\x00"),
        ("region", "eu-west-1\n"),
        ("region", "eu west"),
        ("endpoint_url", "http://minio:9000\n"),
        ("endpoint_url", "ftp://minio:9000"),
        ("endpoint_url", "http://min io:9000"),
        ("endpoint_url", "http://[::1]]]:9000"),
        ("secret_access_key", "a #comment"),
    ],
)
def test_a_store_value_an_engine_would_read_as_more_is_refused(field: str, value: str) -> None:
    """A newline in a key became lines of Spark's profile file, which the AWS SDK acts on (a
    ``credential_process`` ran as the worker's user); an endpoint with a blank crashed
    delta-rs' runtime. The error names the field, never the value."""
    with pytest.raises(ValueError, match=field) as caught:
        ObjectStore(**{field: value})
    assert value.strip() not in str(caught.value)


def test_an_endpoint_in_upper_case_is_still_plain_http() -> None:
    store = ObjectStore(endpoint_url="HTTP://127.0.0.1:9")
    assert store.delta_options()["AWS_ALLOW_HTTP"]
    store.arrow_filesystem()  # pyarrow took "HTTP" for no scheme it knows


@pytest.mark.parametrize(
    "store",
    [
        {"endpoint_url": "http://minio_1:9000"},  # a Docker Compose service name
        {"endpoint_url": "https://[2001:db8::1]:9000/minio"},
        {"endpoint_url": "https://s3.example.com"},
        {"region": "us-gov-west-1"},
        {"region": "cn-north-1"},
        {"region": "auto"},
        {"session_token": "IQoJb3JpZ2luX2VjE/+abc=="},
    ],
)
def test_real_world_stores_are_taken(store: dict[str, str]) -> None:
    ObjectStore(**store)


def test_every_spelling_of_one_lake_is_one_asset() -> None:
    from airflow_pglogrepl.operators._spark import lake_asset

    uris = {lake_asset(s).uri for s in ("s3://b1b/lake", "s3a://b1b/lake/", "s3n://b1b/lake")}
    assert uris == {"s3://b1b/lake"}


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


def test_keys_for_executors_on_other_machines_are_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, s3_server: S3Server
) -> None:
    """The profile file is on the driver's machine only: executors elsewhere failed at their
    first write, after the changelog's windows were committed."""
    from airflow_pglogrepl.operators.drain import SlotDrainOperator

    monkeypatch.setenv("AIRFLOW_CONN_LAKE_KEYS", json.dumps(s3_server.connection()))
    lake_root = f"s3://{s3_server.new_bucket()}/lake"
    operator = SlotDrainOperator(task_id="d", postgres_conn_id="p", slot_name="s",
                                 publications=["p"], lake=lake_root,
                                 lake_conn_id="lake_keys")  # fmt: skip
    operator._master = "spark://10.0.0.1:7077"
    with pytest.raises(LakeLocationError, match="reach Spark's driver only"):
        operator._use_lake_store(lake_root)
    operator._master = "local[2]"
    try:
        operator._use_lake_store(lake_root)
        assert operator._store == s3_server.store == storage.current()
    finally:
        storage.use(None)


def test_a_missing_bucket_or_a_silent_store_is_named_before_anything_starts(
    s3_server: S3Server,
) -> None:
    """Both came as delta-rs' own text from the middle of a run, in terminal colours."""
    from airflow_pglogrepl.exceptions import LakeStoreUnreachableError
    from airflow_pglogrepl.hooks.object_store import check_bucket
    from airflow_pglogrepl.testing.pgcluster import free_port

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
    import socket
    import time

    from airflow_pglogrepl.exceptions import LakeStoreUnreachableError
    from airflow_pglogrepl.hooks.object_store import check_bucket

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


def test_a_jar_list_without_s3a_is_refused_for_an_object_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_pglogrepl.spark.session import delta_jars

    jar = tmp_path / "delta-spark_4.2_2.13-4.4.0.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv("PGLOGREPL_DELTA_JARS", str(jar))
    assert delta_jars() == [str(jar)]
    with pytest.raises(FileNotFoundError, match="without hadoop-aws"):
        delta_jars(object_store=True)


def test_the_profile_file_is_removed_when_the_process_is_terminated(tmp_path: Path) -> None:
    """``on_kill`` sends SIGTERM: the process died at once and left the keys on disk."""
    code = (
        "import sys, time\n"
        "from airflow_pglogrepl.lake import storage\n"
        "storage.use(storage.ObjectStore(access_key_id='A', secret_access_key='S'))\n"
        "print(storage.spark_settings()['spark.hadoop.fs.s3a.auth.profile.file'], flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    profile = child.stdout.readline().strip()
    assert os.path.exists(profile)
    child.terminate()
    assert child.wait(timeout=60) == 143
    assert not os.path.exists(os.path.dirname(profile))


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
